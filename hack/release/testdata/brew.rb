# A stand-in for the part of Homebrew's formula DSL the tap's formula uses, to see what
# it installs on one OS and CPU: ruby brew.rb FORMULA darwin|linux arm64|amd64 prints
# the archive it downloads, its resources and the files its install puts in bin.
$os, $cpu = ARGV[1], ARGV[2]

module OS
  def self.mac? = $os == "darwin"
end

module Hardware
  module CPU
    def self.arm? = $cpu == "arm64"
  end
end

class Resource
  attr_reader :name

  def initialize(name) = @name = name
  def url(u, **) = puts("resource #{@name} url #{u}")
  def sha256(s) = puts("resource #{@name} sha256 #{s}")
  def stage = yield
end

class Formula
  class << self
    attr_reader :resource_list

    def desc(*) = nil
    def homepage(*) = nil
    def version(v) = puts("version #{v}")
    def head(*) = nil # the source build: not this release's
    def test(*) = nil # brew test: run on a Mac
    def url(u, **) = puts("url #{u}")
    def sha256(s) = puts("sha256 #{s}")
    def on_macos = (yield if OS.mac?)
    def on_linux = (yield unless OS.mac?)
    def on_arm = (yield if Hardware::CPU.arm?)
    def on_intel = (yield unless Hardware::CPU.arm?)

    def resource(name, &block)
      r = Resource.new(name)
      r.instance_eval(&block)
      (@resource_list ||= []) << r
    end
  end

  Build = Struct.new(:head?)
  Bin = Struct.new(:nothing) do
    def install(file) = puts("bin #{file}")
  end

  def build = Build.new(false)
  def bin = Bin.new
  def resources = self.class.resource_list || []
  def resource(name) = resources.find { |r| r.name == name } || raise("no resource #{name}")
end

load ARGV[0]
Macfleet.new.install

# Homebrew formula for macfleet, the source of the tap's: `make release` writes
# bin/release/homebrew-tap/Formula/macfleet.rb from this file with the release's version
# and, per OS and CPU, the url and sha256 of its prebuilt archives at RELEASE-ARCHIVES
# (go run ./hack/release tap). Pushed as the repository ORG/homebrew-tap:
#
#   brew install ORG/tap/macfleet           # the release's binaries
#   brew install --HEAD ORG/tap/macfleet    # built from the main branch's source
#
# macfleet is pure Go, for macOS and Linux on arm64 and amd64 (the admin's commands
# anywhere); macfleet-runner (llama.cpp with Metal) is for Apple Silicon only.
class Macfleet < Formula
  desc "Pool Apple Silicon Macs into one OpenAI-compatible LLM serving fleet"
  homepage "https://github.com/macfleet/macfleet"
  # RELEASE-ARCHIVES

  head do
    url "https://github.com/macfleet/macfleet.git", branch: "main"

    depends_on "go" => :build
    # The runner compiles llama.cpp's common helpers, which include nlohmann/json.hpp
    # (headers only, so needed at build time only). No cmake: cgo compiles llama.cpp.
    depends_on "nlohmann-json" => :build
    # mtmd (image input through a projector) includes stb_image.h; headers only.
    depends_on "stb" => :build
  end

  def install
    return install_from_source if build.head?

    bin.install "macfleet"
    resource("runner").stage { bin.install "macfleet-runner" } if runner?
  end

  # runner? is whether this machine gets the runner: an Apple Silicon Mac, from a
  # release that has it.
  def runner?
    OS.mac? && Hardware::CPU.arm? && resources.any? { |r| r.name == "runner" }
  end

  def install_from_source
    stamp = "github.com/macfleet/macfleet/internal/version"
    ldflags = "-s -w -X #{stamp}.version=dev"
    ENV["CGO_ENABLED"] = "0"
    system "go", "build", *std_go_args(ldflags:, output: bin/"macfleet"), "./cmd/macfleet"
    return unless OS.mac? && Hardware::CPU.arm?

    # hack/go-env.sh adds the include paths of llama.cpp inside the Go module cache.
    ENV["CGO_CPPFLAGS"] = "-I#{Formula["nlohmann-json"].opt_include}"
    ENV["CGO_ENABLED"] = "1"
    system "hack/go-env.sh", "go", "build", *std_go_args(ldflags:, output: bin/"macfleet-runner"),
           "./cmd/macfleet-runner"
  end

  def caveats
    <<~EOS
      On one Mac:        macfleet serve --model hf://OWNER/REPO/FILE.gguf
      Start at login:    macfleet serve install -- --model NAME=hf://OWNER/REPO/FILE.gguf
      Join a cluster:    macfleet agent install -- --kubeconfig CREDENTIAL
      The agent finds the runner beside macfleet (#{opt_bin}/macfleet-runner); on Linux
      and Intel Macs only the admin's commands run (the runner needs Apple Silicon).
    EOS
  end

  test do
    assert_match "macfleet #{build.head? ? "dev" : "v#{version}"}", shell_output("#{bin}/macfleet version")
    assert_match "macfleet-runner", shell_output("#{bin}/macfleet-runner --version") if (bin/"macfleet-runner").exist?
  end
end

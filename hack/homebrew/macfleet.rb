# Homebrew formula for macfleet: builds `macfleet` (pure Go) and `macfleet-runner`
# (llama.cpp through cgo, with Metal) from a release's source on an Apple Silicon Mac.
#
# Each release attaches this file with its source archive and checksum filled in at
# RELEASE-SOURCE (.github/workflows/release.yml):
#
#   brew install --formula ./macfleet.rb        # the release asset
#   brew install --HEAD hack/homebrew/macfleet.rb  # this file: the main branch
class Macfleet < Formula
  desc "Pool Apple Silicon Macs into one OpenAI-compatible LLM serving fleet"
  homepage "https://github.com/macfleet/macfleet"
  # RELEASE-SOURCE
  head "https://github.com/macfleet/macfleet.git", branch: "main"

  depends_on "go" => :build
  # The runner compiles llama.cpp's common helpers, which include nlohmann/json.hpp
  # (headers only, so needed at build time only). No cmake: cgo compiles llama.cpp.
  depends_on "nlohmann-json" => :build
  # mtmd (image input through a projector) includes stb_image.h; headers only.
  depends_on "stb" => :build
  depends_on arch: :arm64
  depends_on :macos

  def install
    stamp = "github.com/macfleet/macfleet/internal/version"
    tag = build.head? ? "dev" : "v#{version}"
    ldflags = "-s -w -X #{stamp}.version=#{tag}"
    ENV["CGO_CPPFLAGS"] = "-I#{Formula["nlohmann-json"].opt_include}"

    ENV["CGO_ENABLED"] = "0"
    system "go", "build", *std_go_args(ldflags:, output: bin/"macfleet"), "./cmd/macfleet"
    # hack/go-env.sh adds the include paths of llama.cpp inside the Go module cache.
    ENV["CGO_ENABLED"] = "1"
    system "hack/go-env.sh", "go", "build", *std_go_args(ldflags:, output: bin/"macfleet-runner"),
           "./cmd/macfleet-runner"
  end

  def caveats
    <<~EOS
      On one Mac:        macfleet serve --model hf://OWNER/REPO/FILE.gguf
      Start at login:    macfleet serve install -- --model NAME=hf://OWNER/REPO/FILE.gguf
      Join a cluster:    macfleet agent install -- --kubeconfig CREDENTIAL
      The agent finds the runner beside macfleet (#{opt_bin}/macfleet-runner).
    EOS
  end

  test do
    assert_match "macfleet #{build.head? ? "dev" : "v#{version}"}", shell_output("#{bin}/macfleet version")
    assert_match "macfleet-runner", shell_output("#{bin}/macfleet-runner --version")
  end
end

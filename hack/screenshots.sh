#!/usr/bin/env bash
# Regenerates the console screenshots under docs/images/ from the browser test on the
# local e2e fleet (test/e2e TestConsoleOnFleet: a real manager, gateway, agents and
# runners; headless Chromium). Needs what `make test` needs, and chromium.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
art=$(mktemp -d)
trap 'rm -rf "$art"' EXIT
ARTIFACTS=$art hack/go-env.sh go test -count=1 -run '^TestConsoleOnFleet$' ./test/e2e/
mkdir -p docs/images
for page in fleet models unloads playground; do
	cp "$art/TestConsoleOnFleet/$page.png" "docs/images/console-$page.png"
done
ls -l docs/images/console-*.png

#!/usr/bin/env sh
# What the tests need beyond Python packages, installed where missing (Debian): chromium and its
# chromedriver (the chat page's test drives them through selenium, the driver named by path, so
# nothing is downloaded) and tmux (the --color-sources test reads a real terminal). As root, or
# through sudo. Run it once before `python -m pytest`; .ci/run does.
set -eu
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -x /usr/bin/chromedriver ] || missing="$missing chromium-driver"
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "test setup: installing$missing" >&2
$sudo apt-get update -q >&2
# shellcheck disable=SC2086  # the package names, split
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q $missing >&2

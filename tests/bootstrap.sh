#!/usr/bin/env bash
# Install everything deployctl's tests and sandbox need on a fresh Debian/Ubuntu machine:
# OpenSSH sshd + fuser (system packages) and a virtualenv in .venv with deployctl and test deps.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v fuser >/dev/null 2>&1 || missing+=(psmisc)
command -v pgrep >/dev/null 2>&1 || missing+=(procps)      # pgrep/pkill: the sandbox's process checks
command -v ss >/dev/null 2>&1 || missing+=(iproute2)       # ss: the ProxyJump tests' socket owners
command -v git >/dev/null 2>&1 || missing+=(git)           # the wheel test builds from the tracked files
command -v useradd >/dev/null 2>&1 || missing+=(passwd)
# cc: sandbox/sim_network.c, each simulated host's own network stack (a 0.0.0.0 bind on three hosts)
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
# status --watch is tested on a real terminal: tmux runs it, capture-pane reads the screen
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# the sglang-router venv below is made from the system python (the sandbox users must run it)
/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3 python3-venv)
# headless Chromium renders the bench report in tests/unit/test_bench_report_browser.py (skipped without it);
# only where the distribution has the package (Debian: chromium; `apt-cache policy chromium`).
# A fresh machine's package lists may be empty, and a first `apt-get update` may fail: the lists are read
# (twice if need be) before a package or the candidate is looked for, or the package looks absent and the browser tests
# are skipped without a word.
want_chromium=0
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  want_chromium=1
fi
if [ "${#missing[@]}" -gt 0 ] || [ "$want_chromium" = 1 ]; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
    || as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
fi
if [ "$want_chromium" = 1 ]; then
  # not `apt-cache policy | grep -q`: grep stops at the first match, apt-cache dies of SIGPIPE and,
  # under pipefail, the pipeline fails although the candidate is there (2026-12-05: a fresh machine got
  # openssh-server and no chromium, and five browser tests were skipped)
  chromium_policy=$(apt-cache policy chromium 2>/dev/null || true)
  if [[ "$chromium_policy" =~ Candidate:\ [0-9] ]]; then
    missing+=(chromium)
  else
    echo "bootstrap: no chromium package here; the browser tests will be skipped" >&2
  fi
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Each pip call below is skipped when the venv already holds what it would install
# (tests/bootstrap_satisfied.py: every requirement met, transitively): the README's test command runs
# this script every time, and pip took about 7 s (all four calls) to find nothing to do (2026-12-07).
satisfied() { "$1" tests/bootstrap_satisfied.py "${@:2}" >/dev/null 2>&1; }
# editable_mode=compat: a .pth that puts the clone on sys.path. setuptools' default editable mode
# installs an import finder that every start of .venv's python imports (pathlib, re, importlib.util:
# 16 of its 25 ms here, 2026-12-06), and the suite starts the venv's python some 800 times.
# The stamp: pyproject.toml and this install line as pip last installed them (a changed script, version
# or dependency list there reinstalls even when the old requirements are still met).
stamp="$(sha256sum pyproject.toml | cut -d' ' -f1) -e .[test] editable_mode=compat"
if ! { [ "$(cat .venv/.bootstrap-stamp 2>/dev/null)" = "$stamp" ] && [ -x .venv/bin/deployctl ] \
       && satisfied .venv/bin/python --editable "deployctl=$PWD" 'deployctl[test]'; }; then
  rm -f .venv/.bootstrap-stamp
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' --config-settings editable_mode=compat
  printf '%s\n' "$stamp" > .venv/.bootstrap-stamp
fi

# SGLang's router (a Rust binary in a wheel) for the fleet tests, under both of its names, each in
# its own venv made from the system python, so the sandbox's Unix users can run it (.venv's
# interpreter may live under a private home such as /root/.pyenv): sglang-router 0.3.2 (its last
# release) and smg 1.13.0 (Shepherd Model Gateway, the package SGLang's docs install since 2026).
if [ ! -x .router-venv/bin/python ]; then
  /usr/bin/python3 -m venv .router-venv
fi
satisfied .router-venv/bin/python 'sglang-router==0.3.2' \
  || .router-venv/bin/python -m pip install -q --disable-pip-version-check 'sglang-router==0.3.2'
if [ ! -x .smg-venv/bin/python ]; then
  /usr/bin/python3 -m venv .smg-venv
fi
satisfied .smg-venv/bin/python 'smg==1.13.0' \
  || .smg-venv/bin/python -m pip install -q --disable-pip-version-check 'smg==1.13.0'

# The real SGLang wheels the drafter swap's contract tests read (tests/unit/test_sglang_wheel_contract.py,
# issue 41): downloaded, never installed (--no-deps; the tests unzip the few files they need and run
# srt/utils/auth.py, which imports nothing heavy, and read the rest with ast). cp311 wheels.
mkdir -p .sglang-wheels
for version in 0.5.21 0.5.23; do
  if ! ls .sglang-wheels/sglang-"$version"-*.whl >/dev/null 2>&1; then
    .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.11 "sglang==$version" -d .sglang-wheels
  fi
done
# ... and a test-only environment for tests/unit/test_sglang_wheel_payload.py: the system python 3.11
# (the wheels are cp311), a CPU torch, safetensors, pybase64 and numpy (safetensors.torch.save_file);
# SGLang itself is not installed: the test takes its serializer classes and patch_torch.py from the wheels
if [ -x /usr/bin/python3.11 ]; then
  if [ ! -x .sglang-contract-venv/bin/python ]; then
    /usr/bin/python3.11 -m venv .sglang-contract-venv
  fi
  # the CPU build where a wheel of it is at hand (this machine's find-links), else PyPI's torch (it runs on
  # the CPU too, only larger)
  # (either torch: the second line's is what a machine without the CPU build gets)
  satisfied .sglang-contract-venv/bin/python torch safetensors pybase64 numpy msgspec \
    || .sglang-contract-venv/bin/python -m pip install -q --disable-pip-version-check 'torch==2.13.0+cpu' safetensors \
    pybase64 numpy msgspec \
    || .sglang-contract-venv/bin/python -m pip install -q --disable-pip-version-check torch safetensors \
      pybase64 numpy msgspec
fi

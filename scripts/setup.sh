#!/usr/bin/env bash
# One-time (and repeatable) set-up of a Debian machine for fdtrace, as root:
# Debian's bcc, kernel headers (linked for the running kernel when none match), tracefs,
# the test peers, and a virtual environment in .venv that can import bcc.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: run as root (it installs packages and mounts tracefs)" >&2
    exit 1
fi

arch=$(dpkg --print-architecture)
packages=(python3-bpfcc bpfcc-tools "linux-headers-$arch" python3-venv util-linux iproute2 procps gcc
          haproxy golang-go bpftrace strace linux-perf prometheus openjdk-17-jre-headless
          chromium fonts-liberation nginx libnginx-mod-stream)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    apt-get update -q
    # Services the packages bring (prometheus) are not started: the tests start their own.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod +x "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# bcc compiles against /lib/modules/$(uname -r)/build; link the newest installed headers when
# the running kernel has none of its own (BCC_KERNEL_SOURCE does not work with Debian's split
# header packages).
release=$(uname -r)
moddir=/lib/modules/$release
if [ ! -d "$moddir/build/include" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -n 1)
    common=${hdr%-"$arch"}-common
    if [ -z "$hdr" ] || [ ! -d "$common" ]; then
        echo "setup.sh: no /usr/src/linux-headers-*-$arch to link for $release" >&2
        exit 1
    fi
    mkdir -p "$moddir"
    ln -sfn "$hdr" "$moddir/build"
    ln -sfn "$common" "$moddir/source"
    echo "setup.sh: linked $moddir/build -> $hdr (no headers match $release)"
fi

mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing

# The venv uses Debian's Python and sees only Debian's bcc module, through a link.
if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
# The DDP phase tests run a real gloo job: the CPU build of PyTorch 2.13.0 (this exact version:
# the machine image carries it; any other would download gigabytes). fdtrace itself needs no torch.
# It goes first: the test extras (Lightning, transformers) need a torch, and would otherwise pull
# the newest one.
.venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

#!/usr/bin/env bash
# Side-by-side comparison of Sinew with NATS JetStream (default fsync, and
# sync_interval: always) and RabbitMQ (quorum queues), 1 KiB messages, one broker
# at a time on loopback. Installs the peers when they are missing, builds sinew
# and the compare driver, records the machine, then runs every cell RUNS times
# and writes results.json, comparison.md, comparison.svg and machine.md to OUT.
#
#   bench/compare/run.sh                    # everything, 3 runs per cell
#   RUNS=1 DURATION=2s BACKLOG=20000 bench/compare/run.sh   # a quick smoke run
#   BROKERS=sinew,nats-js CELLS=publish-w64 bench/compare/run.sh
#   PROFILE=publish-w64,drain bench/compare/run.sh   # + CPU profiles of sinew serve
#
# It stops only the processes it started: the compare driver launches each
# broker itself and stops it (RabbitMQ through rabbitmqctl on its private node,
# then its private epmd) before starting the next.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PATH="/usr/local/go/bin:$PATH"

tools=${SINEW_BENCH_TOOLS:-$HOME/.cache/sinew-bench}
out=${OUT:-$here/out}
runs=${RUNS:-3}
duration=${DURATION:-5s}
warmup=${WARMUP:-1s}
backlog=${BACKLOG:-300000}
brokers=${BROKERS:-sinew,nats-js,nats-js-sync,rabbitmq}
cells=${CELLS:-publish-w1,publish-w64,drain,mixed}
# NATS with sync_interval: always confirms about 1k msg/s here, so prefilling the
# drain backlog would take minutes per run; its drain is left out by default.
skip=${SKIP-nats-js-sync:drain}
work_root=${WORK_ROOT:-${TMPDIR:-/tmp}}
mkdir -p "$tools/bin" "$out"

want() { [[ ",$brokers," == *",$1"* ]]; }

apt_updated=
apt_install() {
	if [[ -z $apt_updated ]]; then
		apt-get update -qq
		apt_updated=1
	fi
	# Package scripts must not start a system-wide service: only what this
	# script starts may run, and the driver starts its own private node.
	local policy=/usr/sbin/policy-rc.d made_policy=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
	[[ -n $made_policy ]] && rm -f "$policy"
	return 0
}

# --- peers -------------------------------------------------------------------
nats=
if want nats-js; then
	nats=$tools/bin/nats-server
	if [[ ! -x $nats ]]; then
		echo "installing nats-server from the Go module proxy" >&2
		if ! GOBIN=$tools/bin go install github.com/nats-io/nats-server/v2@latest; then
			echo "go install failed; falling back to Debian's nats-server" >&2
			apt_install nats-server
			nats=$(command -v nats-server)
		fi
	fi
fi
rabbit_sbin=/usr/lib/rabbitmq/bin
if want rabbitmq && [[ ! -x $rabbit_sbin/rabbitmq-server ]]; then
	echo "installing Debian's rabbitmq-server" >&2
	apt_install rabbitmq-server
fi

# --- builds ------------------------------------------------------------------
(cd "$root" && go build -o "$tools/bin/sinew" ./cmd/sinew)
# -mod=mod: the bench module follows the main module through its replace
# directive, so a dependency the broker gained later is picked up here.
(cd "$root/bench" && GOFLAGS=-mod=mod go build -o "$tools/bin/sinew-compare" ./compare)

# --- machine and versions ----------------------------------------------------
work=$(mktemp -d "$work_root/sinew-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT
sinew_v="$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
nats_v="$([[ -n $nats ]] && "$nats" --version 2>&1 | head -1 || echo -)"
rabbit_v="$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo -)"
erlang_v="$(dpkg-query -W -f='${Version}' erlang-base 2>/dev/null || echo -)"
go_v="$(go version)"
{
	echo "Run started $(date -u +%Y-%m-%dT%H:%M:%SZ); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	echo '```'
	echo "\$ nproc"; nproc
	echo "\$ lscpu | head -20"; lscpu | head -20
	echo "\$ df -T $work"; df -T "$work"
	echo "\$ uname -r"; uname -r
	echo '```'
	echo
	echo "Versions: sinew $sinew_v; $nats_v; rabbitmq-server $rabbit_v (Erlang $erlang_v); $go_v."
} >"$out/machine.md"

# --- run ---------------------------------------------------------------------
"$tools/bin/sinew-compare" \
	-sinew "$tools/bin/sinew" \
	-nats "${nats:-}" \
	-rabbitmq-sbin "$rabbit_sbin" \
	-brokers "$brokers" -cells "$cells" \
	-runs "$runs" -duration "$duration" -warmup "$warmup" -backlog "$backlog" \
	-work "$work" -out "$out" \
	-sinew-profile "${PROFILE:-}" \
	-skip "$skip" \
	-versions "sinew=$sinew_v;nats-server=$nats_v;rabbitmq-server=$rabbit_v;erlang=$erlang_v;go=$go_v"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.md"
echo "wrote $out/comparison.md, $out/comparison.svg, $out/results.json, $out/machine.md" >&2

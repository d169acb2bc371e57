#!/usr/bin/env bash
# local-cluster.sh: a managoat platform of three `managoat serve` replicas
# on one machine, sharing a throwaway PostgreSQL cluster (the records) and a
# NATS server with JetStream (the runners), plus one runner daemon.
#
#   deploy/local-cluster.sh [--dir DIR] [--keep] [--account NAME] [--no-runner]
#
# Everything lives in a directory the script creates (default: a new one
# under ${TMPDIR:-/tmp}); PostgreSQL listens only on a Unix socket there,
# NATS and the replicas only on 127.0.0.1. NATS (deploy/nats/nats-local.conf)
# admits only the replicas' user, by a password made here, and what the
# replicas send each other is sealed with a cluster key made here
# (cluster.key): another local user can neither connect to NATS nor, with
# the password, read or forge the replicas' messages. Ctrl-C (or SIGTERM, or the
# script's own failure) stops everything it started, destroys the sandboxes
# its runner and replicas made, and removes the directory (unless --keep).
#
# Needs: Debian's postgresql (initdb, pg_ctl) and nats-server packages, and
# managoat ($MANAGOAT_BIN, else managoat on PATH, else built from this
# checkout with go). See deploy/README.md.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: deploy/local-cluster.sh [--dir DIR] [--keep] [--account NAME] [--no-runner]

Starts PostgreSQL, NATS (JetStream) and three managoat serve replicas on
127.0.0.1:8081-8083, creates an account and prints its API key, starts a
runner daemon connected to the first replica, then waits. Ctrl-C stops it all.

  --dir DIR       where everything lives (created; must not exist yet)
  --keep          keep DIR on exit (the records, logs, key), still stopping every process
  --account NAME  the account to create (default demo)
  --no-runner     start no runner daemon

Environment: MANAGOAT_BIN (the managoat binary), MANAGOAT_PORTS (default
"8081 8082 8083"), NATS_PORT (default 14222), RUNNER_NAME; SANDBOX_* reach the
replicas as they are, except that SANDBOX_LOCAL_ENABLED defaults to false
here (see deploy/README.md: the local provider is per host).
EOF
}

dir="" keep=0 account=demo with_runner=1
while (($#)); do
	case $1 in
	--dir) dir=${2:?--dir needs a directory}; shift 2 ;;
	--keep) keep=1; shift ;;
	--account) account=${2:?--account needs a name}; shift 2 ;;
	--no-runner) with_runner=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "local-cluster.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
	esac
done

read -r -a ports <<<"${MANAGOAT_PORTS:-8081 8082 8083}"
nats_port=${NATS_PORT:-14222}
runner_name=${RUNNER_NAME:-$(hostname -s)-runner}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# --- prerequisites, before anything is started --------------------------

pgbin=""
# The newest version first: /usr/lib/postgresql/VERSION/bin.
while read -r d; do
	if [[ -x $d/initdb && -x $d/pg_ctl ]]; then pgbin=$d; break; fi
done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5nr)
[[ -n $pgbin ]] || die "no PostgreSQL server in /usr/lib/postgresql/*/bin: install it with
  sudo apt-get install postgresql
(its own cluster service is not used; this script runs a throwaway one)"

nats=$(command -v nats-server || true)
[[ -z $nats && -x /usr/sbin/nats-server ]] && nats=/usr/sbin/nats-server
[[ -n $nats ]] || die "no nats-server: install it with
  sudo apt-get install nats-server
(Debian 12 ships 2.9.x, JetStream included; the package also enables its own
nats-server.service on 127.0.0.1:4222 without JetStream, which this script
leaves alone: it runs its own on port $nats_port)"

as_pg=()
if ((EUID == 0)); then
	id postgres >/dev/null 2>&1 || die "as root, PostgreSQL runs as the postgres user of Debian's postgresql package; it is missing"
	as_pg=(runuser -u postgres --)
fi

busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "${ports[@]}" "$nats_port"; do
	! busy "$p" || die "127.0.0.1:$p is in use; free it, or set MANAGOAT_PORTS / NATS_PORT"
done

if [[ -z $dir ]]; then
	dir=$(mktemp -d "${TMPDIR:-/tmp}/managoat-cluster.XXXXXX")
else
	[[ ! -e $dir ]] || die "$dir exists; --dir takes a directory the script creates"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
fi
[[ $dir != *[[:space:]]* ]] || die "$dir: a path with spaces does not survive pg_ctl -o"

# --- stopping: whatever happens from here on, the trap undoes it ---------

pids=() names=() local_dirs=() pg_started=0

# stop PID NAME: SIGTERM, then SIGKILL after 10 s.
# shellcheck disable=SC2317 # stop and cleanup run from the trap
stop() {
	local pid=$1 name=$2 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
		sleep 0.1
	done
	say "$name ($pid) did not stop in 10 s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317
cleanup() {
	local rc=$? i d n
	trap - EXIT INT TERM HUP
	set +e
	say "stopping"
	# The runner first, then the replicas, each in reverse order of start.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		[[ ${names[i]} == nats ]] && continue
		stop "${pids[i]}" "${names[i]}"
	done
	# A local sandbox's supervisor outlives every managoat process on
	# purpose (sessions survive restarts): destroy the ones made here.
	for d in "${local_dirs[@]}"; do
		[[ -d $d/sandboxes ]] || continue
		for n in $(MANAGOAT_HOME=$d "$managoat" --provider local ls 2>/dev/null | awk 'NR > 1 { print $1 }'); do
			say "destroying sandbox $n ($d)"
			MANAGOAT_HOME=$d "$managoat" --provider local rm -f "$n" >/dev/null
		done
	done
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		[[ ${names[i]} == nats ]] && stop "${pids[i]}" nats
	done
	if ((pg_started)); then
		(cd "$dir" && "${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null)
	fi
	if ((keep)); then
		say "kept $dir"
	else
		rm -rf "$dir"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# --- managoat ------------------------------------------------------------

managoat=${MANAGOAT_BIN:-$(command -v managoat || true)}
if [[ -z $managoat ]]; then
	if [[ ! -f $here/../go.mod ]] || ! command -v go >/dev/null; then
		die "no managoat: set MANAGOAT_BIN, put managoat on PATH, or run this from a checkout with go installed"
	fi
	say "building managoat from $(cd "$here/.." && pwd)"
	mkdir -p "$dir/bin"
	(cd "$here/.." && go build -o "$dir/bin/managoat" ./cmd/managoat)
	managoat=$dir/bin/managoat
fi

# --- PostgreSQL: a throwaway cluster on a Unix socket in $dir/pg ---------

password=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
mkdir -m 0700 "$dir/pg"
printf '%s\n' "$password" >"$dir/pg/pwfile"
if ((EUID == 0)); then
	chmod 0711 "$dir" # the postgres user traverses it, cannot list it
	chown -R postgres:postgres "$dir/pg"
	"${as_pg[@]}" test -x "$dir" || die "the postgres user cannot reach $dir: a directory above it is not traversable; use --dir under /tmp"
fi
say "PostgreSQL $(basename "$(dirname "$pgbin")"): initdb in $dir/pg/data"
(cd "$dir" && "${as_pg[@]}" "$pgbin/initdb" -D "$dir/pg/data" -U managoat --auth=scram-sha-256 \
	--pwfile="$dir/pg/pwfile" -E UTF8 --no-sync --no-instructions >"$dir/pg/initdb.log" 2>&1) ||
	die "initdb failed: $(tail -5 "$dir/pg/initdb.log")"
rm -f "$dir/pg/pwfile"
pg_started=1
# setsid: a Ctrl-C at the terminal reaches this script only, whose trap
# stops the pieces in order (replicas before the database).
(cd "$dir" && "${as_pg[@]}" setsid "$pgbin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w -t 30 \
	-o "-k $dir/pg -c listen_addresses=''" start >/dev/null) ||
	die "PostgreSQL did not start: $(tail -5 "$dir/pg/postgres.log")"
PGPASSWORD=$password "$pgbin/createdb" -h "$dir/pg" -U managoat managoat

# The password is in the environment, never in a URL on a command line.
db_url="postgres://managoat@/managoat?host=$dir/pg&sslmode=disable"
nats_password=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
nats_url="nats://managoat:$nats_password@127.0.0.1:$nats_port"
# Secrets are written 0600 in a subshell: the umask of the processes
# started below stays as it was (a local sandbox made under umask 077
# cannot run its commands).
(umask 077 && head -c 48 /dev/urandom | base64 -w0 >"$dir/cluster.key")
(umask 077 && cat >"$dir/platform.env") <<EOF
MANAGOAT_DATABASE_URL=$db_url
PGPASSWORD=$password
MANAGOAT_NATS_URL=$nats_url
MANAGOAT_CLUSTER_KEY_FILE=$dir/cluster.key
EOF

# --- NATS with JetStream --------------------------------------------------

# Its settings are its environment's (the password too: never on a command line).
NATS_PORT=$nats_port NATS_STORE_DIR=$dir/nats MANAGOAT_NATS_PASSWORD=$nats_password \
	setsid "$nats" -c "$here/nats/nats-local.conf" -l "$dir/nats.log" &
pids+=($!) names+=(nats)
for ((i = 0; i < 100; i++)); do
	busy "$nats_port" && break
	kill -0 "${pids[-1]}" 2>/dev/null || die "nats-server exited: $(tail -5 "$dir/nats.log")"
	sleep 0.1
done
busy "$nats_port" || die "nats-server is not listening on $nats_port after 10 s"
say "NATS $("$nats" --version | awk '{ print $2 }') with JetStream on 127.0.0.1:$nats_port (user managoat, its password in platform.env)"

# --- the account and its key ----------------------------------------------

# The replicas' secrets are in this script's environment, never on a
# command line (ps shows those to every user); the runner gets none.
export MANAGOAT_DATABASE_URL=$db_url PGPASSWORD=$password MANAGOAT_NATS_URL=$nats_url MANAGOAT_CLUSTER_KEY_FILE=$dir/cluster.key
platform_env=(env -u MANAGOAT_RUNNER_TOKEN -u MANAGOAT_API_KEY -u MANAGOAT_URL)
mkdir -p "$dir/admin"
"${platform_env[@]}" MANAGOAT_HOME="$dir/admin" "$managoat" serve admin account create "$account" >/dev/null ||
	die "$managoat serve admin account create $account failed"
(umask 077 && "${platform_env[@]}" MANAGOAT_HOME="$dir/admin" "$managoat" serve admin key create "$account" >"$dir/$account.key") ||
	die "$managoat serve admin key create $account failed"

# --- three replicas ---------------------------------------------------------

export SANDBOX_LOCAL_ENABLED=${SANDBOX_LOCAL_ENABLED:-false}
if [[ $SANDBOX_LOCAL_ENABLED == false && -z ${SANDBOX_PROVIDER:-} ]]; then
	export SANDBOX_PROVIDER=runner
fi
for i in "${!ports[@]}"; do
	n=$((i + 1)) home=$dir/replica-$((i + 1))
	mkdir -p "$home"
	: >"$dir/replica-$n.log" # there before the wait below reads it
	local_dirs+=("$home/platform/local")
	"${platform_env[@]}" MANAGOAT_HOME="$home" setsid "$managoat" serve --listen "127.0.0.1:${ports[i]}" \
		>"$dir/replica-$n.log" 2>&1 &
	pids+=($!) names+=("replica-$n")
done
for i in "${!ports[@]}"; do
	n=$((i + 1))
	for ((t = 0; t < 300; t++)); do
		grep -q 'listening on' "$dir/replica-$n.log" && break
		kill -0 "${pids[i + 1]}" 2>/dev/null || die "replica $n exited: $(tail -5 "$dir/replica-$n.log")"
		sleep 0.1
	done
	grep -q 'listening on' "$dir/replica-$n.log" || die "replica $n did not listen in 30 s: $(tail -5 "$dir/replica-$n.log")"
done
say "replicas on $(printf 'http://127.0.0.1:%s ' "${ports[@]}")($(grep -o 'providers enabled: [^;]*' "$dir/replica-1.log"))"

# --- a runner daemon on the first replica ----------------------------------

if ((with_runner)); then
	mkdir -p "$dir/runner"
	: >"$dir/runner.log"
	local_dirs+=("$dir/runner/runners/$runner_name")
	env -u MANAGOAT_RUNNER_TOKEN -u MANAGOAT_API_KEY -u MANAGOAT_URL -u MANAGOAT_DATABASE_URL -u PGPASSWORD \
		-u MANAGOAT_NATS_URL -u MANAGOAT_CLUSTER_KEY_FILE MANAGOAT_HOME="$dir/runner" \
		setsid "$managoat" runner --url "http://127.0.0.1:${ports[0]}" --name "$runner_name" \
		--token-file "$dir/$account.key" >"$dir/runner.log" 2>&1 &
	pids+=($!) names+=(runner)
	for ((t = 0; t < 300; t++)); do
		grep -q 'runner connected' "$dir/runner.log" && break
		kill -0 "${pids[-1]}" 2>/dev/null || die "the runner exited: $(tail -5 "$dir/runner.log")"
		sleep 0.1
	done
	grep -q 'runner connected' "$dir/runner.log" || die "the runner did not connect in 30 s: $(tail -5 "$dir/runner.log")"
	say "runner $runner_name connected to http://127.0.0.1:${ports[0]}"
fi

m=managoat
[[ $(command -v managoat || true) == "$managoat" ]] || m=$managoat
cat <<EOF

The platform is up. Everything is in $dir:
  platform.env         MANAGOAT_DATABASE_URL, PGPASSWORD, MANAGOAT_NATS_URL, MANAGOAT_CLUSTER_KEY_FILE (for serve admin, and a replica more)
  cluster.key          the replicas' cluster key
  $account.key             the API key of account $account
  replica-N.log, runner.log, nats.log, pg/postgres.log

Account $account, API key (shown here once):
$(cat "$dir/$account.key")

In another terminal, any replica serves the same sandboxes:
  export MANAGOAT_URL=http://127.0.0.1:${ports[1]} MANAGOAT_API_KEY=\$(cat $dir/$account.key)
  $m create box && $m exec box -- uname -a
  MANAGOAT_URL=http://127.0.0.1:${ports[0]} $m ls
  $m rm box
More accounts and keys:
  set -a; . $dir/platform.env; set +a; $m serve admin account create NAME

Ctrl-C stops everything.
EOF

# Wait until a signal, or until one of the pieces exits on its own.
set +e
wait -n "${pids[@]}"
rc=$?
set -e
for i in "${!pids[@]}"; do
	if ! kill -0 "${pids[i]}" 2>/dev/null; then
		say "${names[i]} exited ($rc); see its log in $dir"
	fi
done
exit 1

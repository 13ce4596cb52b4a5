# Shared argument parsing for the TPU VM scripts. Source it; do not run it.
# Every script takes: --name NAME --zone ZONE [--project PROJECT]; see each script's usage.
set -euo pipefail
NAME="" ZONE="" PROJECT="" ACCEL="" BUCKET="" VERSION="" PRESET="" STAGE="ppo" EXTRA=""
usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME=$2; shift 2;;
    --zone) ZONE=$2; shift 2;;
    --project) PROJECT=$2; shift 2;;
    --accelerator-type) ACCEL=$2; shift 2;;
    --version) VERSION=$2; shift 2;;
    --bucket) BUCKET=$2; shift 2;;
    --preset) PRESET=$2; shift 2;;
    --stage) STAGE=$2; shift 2;;
    --) shift; EXTRA="$*"; break;;
    -h|--help) usage;;
    *) echo "unknown argument: $1" >&2; usage;;
  esac
done
[ -n "$NAME" ] && [ -n "$ZONE" ] || { echo "--name and --zone are required" >&2; usage; }
GCLOUD_ARGS=(--zone="$ZONE")
[ -n "$PROJECT" ] && GCLOUD_ARGS+=(--project="$PROJECT")
REPO_DIR='~/spa_jax'
on_all_hosts() {  # run a shell command on every host of the slice, in parallel
  gcloud compute tpus tpu-vm ssh "$NAME" "${GCLOUD_ARGS[@]}" --worker=all --command="$1"
}

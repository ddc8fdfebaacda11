#!/usr/bin/env bash
# Build the operator, gateway and simulator images from the Dockerfile, with or without a Docker engine.
#
# With a running Docker engine: `docker build` of every target, the engine image included.
# Without one: buildah (chroot isolation, vfs storage, its own store under the cache directory), from the
# same Dockerfile. The Python base is the Dockerfile's usual one when it can be pulled; otherwise a
# minimal Debian bookworm root filesystem (its python3 is 3.11) is made with debootstrap from this
# machine's configured Debian mirror, cached outside the checkout keyed by a hash of its recipe, and
# imported into the store, so a second run reuses it. Each image is exported as an OCI archive that
# `skopeo copy oci-archive:FILE docker://REGISTRY/...` can push. The engine image (SGLang's own base)
# is built only with Docker.
#
# Usage: hack/images.sh [target ...]       # default: operator gateway sim (and engine with Docker)
# Env:   GENRM_IMAGE_BUILDER   docker | buildah (default: docker when its engine answers, else buildah)
#        GENRM_BASE            auto | local | <image> (default auto: the Dockerfile's base, else local)
#        GENRM_BASE_REFRESH=1  make the local base again (for example, to take Debian's security updates)
#        GENRM_DEBIAN_MIRROR   the Debian mirror to use (default: read from apt's configured sources)
#        GENRM_CACHE           cache root (default ~/.cache/genrm-operator)
#        IMAGES_DIR            where the OCI archives go (default dist/images in the checkout)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[images] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml")"
CACHE="${GENRM_CACHE:-$HOME/.cache/genrm-operator}"
IMAGES_DIR="${IMAGES_DIR:-$REPO/dist/images}"
DEFAULT_BASE="$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$REPO/Dockerfile")"
[[ -n "$DEFAULT_BASE" ]] || die "the Dockerfile declares no ARG PYTHON_IMAGE default"

builder="${GENRM_IMAGE_BUILDER:-}"
if [[ -z "$builder" ]]; then
  # A docker client alone is not enough: it needs an engine that answers.
  if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then builder=docker; else builder=buildah; fi
fi

human() { numfmt --to=iec-i --suffix=B --format='%.1f' "$1"; }

if [[ "$builder" == docker ]]; then
  targets=("${@:-operator gateway sim engine}")
  read -r -a targets <<<"${targets[*]}"
  for t in "${targets[@]}"; do
    log "docker build --target $t"
    docker build --target "$t" -t "genrm/$t:$VERSION" "$REPO"
  done
  for t in "${targets[@]}"; do
    printf '%-28s %s\n' "genrm/$t:$VERSION" "$(human "$(docker image inspect --format '{{.Size}}' "genrm/$t:$VERSION")")"
  done
  exit 0
fi
[[ "$builder" == buildah ]] || die "GENRM_IMAGE_BUILDER must be docker or buildah, not $builder"

targets=("${@:-operator gateway sim}")
read -r -a targets <<<"${targets[*]}"
for t in "${targets[@]}"; do
  [[ "$t" != engine ]] || die "the engine image builds on SGLang's own base image: build it with Docker"
done

# The tools, from Debian, when missing (as `make tools` does for the tests' tools).
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  [[ $EUID -eq 0 ]] || die "install ${need[*]} (apt-get install ${need[*]})"
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The project's own image store: vfs needs no overlay support from the kernel or a fuse helper, and a
# separate store leaves any other containers/storage on the machine untouched.
STORE="$CACHE/images/storage"
RUNROOT="${XDG_RUNTIME_DIR:-/run}/genrm-operator-images"
mkdir -p "$STORE" "$IMAGES_DIR"
B=(buildah --root "$STORE" --runroot "$RUNROOT" --storage-driver vfs)
exec 9>"$CACHE/images/.lock"
flock 9

have_image() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# --- the local base ----------------------------------------------------------------------------------
SUITE=bookworm
BASE_PACKAGES="python3 python3-venv ca-certificates netbase tzdata"
ARCH="$(dpkg --print-architecture)"

# The Debian mirror and its security mirror, as apt on this machine is configured (one-line and deb822
# sources): the entries for this machine's own release give the URIs, used here for bookworm.
apt_mirrors() {
  python3 - <<'EOF'
import glob, os, re
codename = ""
for line in open("/etc/os-release"):
    if line.startswith("VERSION_CODENAME="):
        codename = line.split("=", 1)[1].strip().strip('"')
entries = []  # (uri, suites, components)
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    if os.path.exists(path):
        for line in open(path):
            line = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 4 and line[0] == "deb":
                entries.append((line[1], [line[2]], line[3:]))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for para in re.split(r"\n\s*\n", open(path).read()):
        fields = {}
        for line in para.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.split()
        if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"])[0] != "no":
            for uri in fields.get("uris", []):
                entries.append((uri, fields.get("suites", []), fields.get("components", [])))
main = next((u for u, s, c in entries if codename in s and "main" in c), "")
security = next((u for u, s, c in entries if f"{codename}-security" in s and "main" in c), "")
print(main, security)
EOF
}

# The recipe of the base: every step and input below is hashed into its cache key (the mirror is not:
# it serves the same packages).
make_base() { # rootfs-dir mirror security-mirror
  local root=$1 mirror=$2 security=$3
  debootstrap --variant=minbase --arch="$ARCH" "$SUITE" "$root" "$mirror" >&2
  # Slim as Debian's own container images: no documentation but the copyrights, no manuals or locales.
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$root/etc/apt/apt.conf.d/slim"
  {
    echo "deb $mirror $SUITE main"
    echo "deb $mirror $SUITE-updates main"
    [[ -z "$security" ]] || echo "deb $security $SUITE-security main"
  } >"$root/etc/apt/sources.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # shellcheck disable=SC2016
  unshare --mount --propagation private -- sh -ec '
    mount -t proc proc "$1/proc"
    chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 sh -ec "
      apt-get update -qq
      apt-get upgrade -y -qq
      apt-get install -y -qq $2
      apt-get clean
    "' sh "$root" "$BASE_PACKAGES" >&2
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old \
    "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/etc/resolv.conf \
    "$root"/etc/machine-id "$root"/etc/hostname
  find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/usr/share/lintian/*
  : >"$root/etc/machine-id"
}

local_base() {
  local key dir tarball tag
  key="$(printf '%s\n' "$SUITE" "$ARCH" "$BASE_PACKAGES" "$(declare -f make_base)" | sha256sum | cut -c1-16)"
  dir="$CACHE/images/base-$SUITE-$key"
  tarball="$dir/rootfs.tar"
  tag="localhost/genrm/python-base:$SUITE-$key"
  if [[ "${GENRM_BASE_REFRESH:-}" == 1 ]]; then
    log "GENRM_BASE_REFRESH=1: making the base again"
    rm -rf "$dir"; "${B[@]}" rmi -f "$tag" >/dev/null 2>&1 || true
  fi
  if have_image "$tag"; then log "reuse base $tag"; echo "$tag"; return; fi
  if [[ ! -f "$tarball" ]]; then
    [[ $EUID -eq 0 ]] || die "making the base image needs root (debootstrap, chroot)"
    local mirror security
    read -r mirror security <<<"$(apt_mirrors)"
    mirror="${GENRM_DEBIAN_MIRROR:-$mirror}"
    [[ -n "$mirror" ]] || die "no Debian mirror in apt's sources: set GENRM_DEBIAN_MIRROR"
    log "making the base: debootstrap --variant=minbase $SUITE + $BASE_PACKAGES (takes minutes)"
    local start=$SECONDS work
    mkdir -p "$CACHE/images"
    work="$(mktemp -d "$CACHE/images/.base.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    make_base "$work/rootfs" "$mirror" "$security"
    tar --numeric-owner --xattrs --sort=name -C "$work/rootfs" -cf "$work/rootfs.tar" .
    mkdir -p "$dir"
    mv "$work/rootfs.tar" "$tarball"
    rm -rf "$work"; trap - EXIT
    log "made the base in $((SECONDS - start))s: $(human "$(stat -c %s "$tarball")") ($tarball)"
  fi
  log "importing the base as $tag"
  local ctr mnt
  ctr="$("${B[@]}" from scratch)"
  mnt="$("${B[@]}" mount "$ctr")"
  tar --numeric-owner --xattrs -xpf "$tarball" -C "$mnt"
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config --os linux --arch "$ARCH" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label org.opencontainers.image.description="Debian $SUITE minbase with $BASE_PACKAGES" \
    "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$tag" >/dev/null
  echo "$tag"
}

base="${GENRM_BASE:-auto}"
start=$SECONDS
case "$base" in
  local) base="$(local_base)" ;;
  auto)
    if have_image "$DEFAULT_BASE"; then
      base="$DEFAULT_BASE"
    elif timeout 120 "${B[@]}" pull --quiet "$DEFAULT_BASE" >/dev/null 2>&1; then
      log "pulled $DEFAULT_BASE"; base="$DEFAULT_BASE"
    else
      log "cannot pull $DEFAULT_BASE ($((SECONDS - start))s): using a local Debian $SUITE base"
      base="$(local_base)"
    fi ;;
esac
log "base image: $base"

# A TLS-intercepting proxy's CA (pip's `cert`, as PIP_CERT or in its configuration) is mounted for the
# build stage's pip only; no image that ships holds it.
ca="${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}"
ca_args=()
if [[ -n "$ca" && -f "$ca" ]]; then
  ca_args=(--volume "$ca:/run/genrm-build-ca.pem:ro" --build-arg PIP_CERT=/run/genrm-build-ca.pem)
fi

# The build's inputs: the Dockerfile, the base image, and every file the build context lets in (the
# `!` lines of .dockerignore). With vfs even a fully cached build copies each stage's whole root
# filesystem (minutes), so an image built from the same inputs and still in the store is not built
# again, whichever checkout asks (the hash and the image ID are kept in the cache, beside the store);
# a checkout without its archive only exports it.
inputs="$(
  cd "$REPO"
  mapfile -t roots < <(sed -n 's/^!\(.*\)/\1/p' .dockerignore)
  {
    echo "base $("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$base")"
    sha256sum Dockerfile .dockerignore
    find "${roots[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)"

mkdir -p "$CACHE/images/inputs"
for t in "${targets[@]}"; do
  image="genrm/$t:$VERSION"
  archive="$IMAGES_DIR/genrm-$t-$VERSION.oci.tar"
  stamp="$CACHE/images/inputs/$t-$VERSION"
  id="$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)"
  if [[ -n "$id" && -f "$stamp" && "$(cat "$stamp")" == "$inputs $id" ]]; then
    log "reuse $image (inputs $inputs unchanged)"
  else
    rm -f "$stamp" "$archive"
    log "buildah bud --target $t"
    start=$SECONDS
    "${B[@]}" bud --isolation chroot --layers --pull=never --target "$t" --build-arg "PYTHON_IMAGE=$base" \
      "${ca_args[@]}" -t "$image" -f "$REPO/Dockerfile" "$REPO" >&2
    echo "$inputs $("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image")" >"$stamp"
    log "built $image in $((SECONDS - start))s"
  fi
  # The archive says which image it holds: an old one (another build of the same tag) is made again.
  if [[ ! -f "$archive" || "$(cat "$archive.id" 2>/dev/null)" != "$(cat "$stamp")" ]]; then
    rm -f "$archive"
    "${B[@]}" push --quiet --compression-format gzip "$image" "oci-archive:$archive:$VERSION" >/dev/null
    cp "$stamp" "$archive.id"
  fi
done

printf '%-28s %-10s %-10s %s\n' IMAGE SIZE ARCHIVE "OCI ARCHIVE"
for t in "${targets[@]}"; do
  archive="$IMAGES_DIR/genrm-$t-$VERSION.oci.tar"
  size="$("${B[@]}" images --format '{{.Size}}' "genrm/$t:$VERSION" | head -1)"
  printf '%-28s %-10s %-10s %s\n' "genrm/$t:$VERSION" "$size" "$(human "$(stat -c %s "$archive")")" "$archive"
done

# Sourced by the scripts that run on the GPU machine (root must be set): sets `carry` to the
# folder of binaries that scripts/build_cuda.sh lays out (TLSE_CARRY overrides it). A device call
# carries at most 64 MiB, less than that folder, so the build also packs it into
# build-cuda/carry.tar.gz (about a third of the size): where only the archive came along, it is
# unpacked here first.
carry=${TLSE_CARRY:-$root/build-cuda/carry}
if [ ! -d "$carry" ] && [ -z "${TLSE_CARRY:-}" ] && [ -f "$root/build-cuda/carry.tar.gz" ]; then
  tar -xzf "$root/build-cuda/carry.tar.gz" -C "$root/build-cuda"
fi

# Sourced by the scripts that run on the GPU machine (root must be set): sets `carry` to the
# folder of binaries that scripts/build_cuda.sh lays out (TLSE_CARRY overrides it). A device call
# carries at most 64 MiB, less than that folder, so the build also packs it into
# build-cuda/carry.tar.gz (about a third of the size). The folder is unpacked here from the
# archive unless it already was, from this very archive (its checksum noted in carry/.archive-md5):
# a machine kept warm between device calls still holds the folder of an earlier call's archive
# (seen: a test ran an earlier build's binary; docs/notes/2026-11-27.md, "Products in clusters of
# two CTAs"). A folder fresh from the build has no note and is unpacked once more, to the same
# files.
carry=${TLSE_CARRY:-$root/build-cuda/carry}
if [ -z "${TLSE_CARRY:-}" ] && [ -f "$root/build-cuda/carry.tar.gz" ]; then
  archive_md5=$(md5sum <"$root/build-cuda/carry.tar.gz" | cut -d' ' -f1)
  if [ "$(cat "$carry/.archive-md5" 2>/dev/null)" != "$archive_md5" ]; then
    rm -rf "$carry"
    tar -xzf "$root/build-cuda/carry.tar.gz" -C "$root/build-cuda"
    echo "$archive_md5" >"$carry/.archive-md5"
  fi
fi

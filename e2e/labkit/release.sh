# roam's release binaries, built by one cargo run with one set of features into one target
# directory (sourced by e2e/lab's roam.sh, build-images.sh and build-roam-image.sh): the
# controller's, roam-node's, roam-cni's and roam-shim's. Building them apart would build the
# dependencies they share once per feature set (and, before, once per target directory).

ROAM_RELEASE_ARGS=(--locked --release
  -p roam-migrator --bin roam-controller -p roam-node --bin roam-node
  -p roam-cni --bin roam-cni -p roam-vm-shim --bin roam-shim)

# release_build REPO TARGET_DIR: build them, saying what it does. A fresh machine compiles
# ~300 crates (~14 minutes on 2 CPUs): a line every 30 crates and the slow ones' names show
# it moving; a warning or an error is shown whole.
release_build() {
  local repo=$1 target=$2 src
  # The target directory is shared by every checkout of this machine, and cargo judges a
  # workspace crate fresh by mtimes: another checkout's newer build would pass for this one's.
  # When the sources differ from the last build's, they are touched so that cargo rebuilds
  # roam's crates (the dependencies stay cached); when they are the same, the last build's
  # binaries are this checkout's and cargo is not run.
  # (every file of the crates: a source may include a file that is not Rust)
  src=$(cd "$repo" && find crates Cargo.toml Cargo.lock -type f -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
  if [ "$(cat "$target/roam-sources.stamp" 2>/dev/null)" = "$src" ] \
    && [ -x "$target/release/roam-controller" ] && [ -x "$target/release/roam-shim" ]; then
    return 0
  fi
  (cd "$repo" && find crates -type f -name '*.rs' -exec touch {} +)
  printf '[release %s] building roam-controller, roam-node, roam-cni, roam-shim (release, into %s)\n' \
    "$(date +%H:%M:%S)" "$target" >&2
  local t0=$SECONDS
  # (the callers run with pipefail: cargo's failure is the pipeline's)
  if ! (cd "$repo" && PATH="$HOME/.cargo/bin:$PATH" CARGO_TARGET_DIR="$target" \
    cargo build "${ROAM_RELEASE_ARGS[@]}" --color never 2>&1) | release_progress "$t0"; then
    echo "the release build failed (its errors above)" >&2
    return 1
  fi
  mkdir -p "$target" && echo "$src" > "$target/roam-sources.stamp"
  printf '[release %s] done in %d s\n' "$(date +%H:%M:%S)" $((SECONDS - t0)) >&2
}

# cargo's output on stdin → a line every 30 crates compiled and for each of roam's own; any
# other line (a warning, an error) whole. Read line by line as cargo writes (awk would read
# its input in blocks through a pipe and say everything at the end).
release_progress() {
  local t0=$1 line n=0 word crate
  while IFS= read -r line; do
    read -r word crate _ <<<"$line"
    case $word in
      Compiling)
        n=$((n + 1))
        if [ $((n % 30)) = 0 ] || [[ $crate == roam-* ]]; then
          printf '[release +%ds] %d crates compiled (now %s)\n' $((SECONDS - t0)) "$n" "$crate" >&2
        fi ;;
      Finished) printf '[release +%ds] %d crates compiled; %s\n' $((SECONDS - t0)) "$n" "$line" >&2 ;;
      Fresh|Downloaded|Downloading|Locking|Updating|Blocking|Adding) ;;
      *) printf '%s\n' "$line" >&2 ;;
    esac
  done
}

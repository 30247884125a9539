#!/usr/bin/env bash
# Proves idem is adoptable: installs it (static, then shared) and builds tests/package/consumer
# against it with find_package(idem) and with pkg-config; each consumer runs. (add_subdirectory
# and FetchContent consumers are ctest tests: Package.Consumer.*.)
# Usage: tests/package/run.sh [WORK_DIR] [STATIC_BUILD_DIR] (WORK_DIR default: build-package/ in
# the source tree). STATIC_BUILD_DIR: a configured and built static build of idem (CI passes the
# release stage's) installed as it is instead of building the static library once more.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-$ROOT/build-package}"
STATIC_BUILD="${2:-}"
CONSUMER="$ROOT/tests/package/consumer"
JOBS="$(nproc)"
rm -rf "$WORK"
mkdir -p "$WORK"

say() { printf '[package] %s\n' "$*"; }

# install_idem NAME CMAKE_ARGS...: builds idem's library alone and installs it into $WORK/NAME.
install_idem() {
  local name=$1; shift
  cmake -S "$ROOT" -B "$WORK/$name-build" -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_TESTS=OFF \
    -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_BENCH=OFF "$@" >/dev/null
  cmake --build "$WORK/$name-build" -j"$JOBS" >/dev/null
  cmake --install "$WORK/$name-build" --prefix "$WORK/$name" >/dev/null
}

# build_consumer NAME CMAKE_ARGS...: configures, builds and runs the consumer.
build_consumer() {
  local name=$1; shift
  cmake -S "$CONSUMER" -B "$WORK/consumer-$name" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$WORK/consumer-$name" -j"$JOBS" >/dev/null
  "$WORK/consumer-$name/idem_consumer"
}

pc_libdir() { dirname "$(find "$WORK/$1" -name idem.pc -print -quit)"; }

if [[ -n "$STATIC_BUILD" ]]; then
  if ! grep -q '^IDEM_INSTALL:BOOL=ON$' "$STATIC_BUILD/CMakeCache.txt" ||
    grep -q '^BUILD_SHARED_LIBS:BOOL=ON$' "$STATIC_BUILD/CMakeCache.txt"; then
    say "$STATIC_BUILD is not a static build of idem with install rules"
    exit 1
  fi
  say "static library: install from $STATIC_BUILD"
  cmake --install "$STATIC_BUILD" --prefix "$WORK/static" >/dev/null
else
  say "static library: install"
  install_idem static
fi
say "static library: the installed idemctl runs"
"$WORK/static/bin/idemctl" --help >/dev/null
say "static library: find_package(idem)"
build_consumer static -DCMAKE_PREFIX_PATH="$WORK/static"
say "static library: pkg-config"
# The Asio defines idem is built with reach pkg-config users too, not only CMake's target, so a
# pkg-config user allocates Asio's handler memory as idem does.
pkg-config --cflags "$(pc_libdir static)/idem.pc" | grep -q -- '-DASIO_DISABLE_STD_ALIGNED_ALLOC' || {
  say "idem.pc's Cflags lack ASIO_STANDALONE / ASIO_DISABLE_STD_ALIGNED_ALLOC"
  exit 1
}
export PKG_CONFIG_PATH="$(pc_libdir static)"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
c++ -std=c++20 "$CONSUMER/main.cc" -o "$WORK/consumer-pkg-config" $(pkg-config --cflags --libs idem)
"$WORK/consumer-pkg-config"
if command -v clang++ >/dev/null; then
  say "static library: pkg-config, clang++ and the async front (idem.pc's Asio definitions)"
  printf '#include <idem/async_deduplicator.h>\n#include <idem/idem.h>\n' >"$WORK/async.cc"
  # shellcheck disable=SC2046
  clang++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror "$WORK/async.cc" $(pkg-config --cflags idem)
fi

say "shared library: install"
install_idem shared -DBUILD_SHARED_LIBS=ON
say "shared library: the installed idemctl runs (finds libidem.so beside it)"
"$WORK/shared/bin/idemctl" --help >/dev/null
say "shared library: find_package(idem)"
build_consumer shared -DCMAKE_PREFIX_PATH="$WORK/shared"
lib="$(find "$WORK/shared" -name 'libidem.so' -print -quit)"
# Names (not template arguments) from the private dependencies or idem::detail must stay hidden.
leaked="$(nm -DC --defined-only "$lib" | cut -d' ' -f3- |
  grep -E '^((typeinfo|typeinfo name|vtable) for )?(fmt|simdjson|pqxx|idem::detail)::' || true)"
if [[ -n "$leaked" ]]; then
  say "libidem.so exports symbols that should be hidden:"
  echo "$leaked" | head -n 20
  exit 1
fi
say "shared library: pkg-config"
export PKG_CONFIG_PATH="$(pc_libdir shared)"
# shellcheck disable=SC2046
c++ -std=c++20 "$CONSUMER/main.cc" -o "$WORK/consumer-pkg-config-shared" \
  $(pkg-config --cflags --libs idem) -Wl,-rpath,"$(dirname "$lib")"
"$WORK/consumer-pkg-config-shared"

say "all consumers built and ran"

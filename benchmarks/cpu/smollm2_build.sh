#!/usr/bin/env bash
# Issue #29 item 5, kept for its callers: benchmarks/cpu/profile_build.sh smollm2.
exec bash "$(dirname "$0")/profile_build.sh" smollm2 "$@"

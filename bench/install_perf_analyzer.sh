#!/usr/bin/env bash
# Installs Triton's load generator, perf_analyzer, in its own virtual environment
# (bench/.perf_analyzer) so that its tritonclient pin does not touch the server's.
# The binary ships inside the tritonclient 2.51.0 manylinux wheel; it needs libb64 (Debian
# package libb64-0d) and libcudart.so.12 (PyPI package nvidia-cuda-runtime-cu12), though it
# runs on machines without a GPU.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.perf_analyzer"
if ! ldconfig -p | grep -q libb64.so.0d; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq libb64-0d
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq libb64-0d
  fi
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet 'tritonclient[all]==2.51.0' nvidia-cuda-runtime-cu12
cudart="$(dirname "$(find "$venv" -name 'libcudart.so.12' | head -n 1)")"
cat > "$venv/perf_analyzer" <<WRAP
#!/usr/bin/env bash
LD_LIBRARY_PATH="$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$venv/bin/perf_analyzer" "\$@"
WRAP
chmod +x "$venv/perf_analyzer"
echo "perf_analyzer installed: $venv/perf_analyzer"

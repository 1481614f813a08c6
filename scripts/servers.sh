# Test servers for chute's remote-storage tests; sourced by scripts/test.sh when
# CHUTE_TEST_SERVERS=1 (set by .ci/run). Starts, on 127.0.0.1 only:
#   - nginx (the Debian package) serving a scratch directory, with range requests;
#   - moto in server mode (S3-compatible, from PyPI, in the test venv), bucket chute-test;
#   - scripts/faultproxy.py in front of nginx twice: one that misbehaves on a schedule
#     (503, 429, bodies cut mid-way, resets, a stall) and one that always answers 503 under
#     /always503/;
#   - Azurite (blob) and gcp-storage-emulator when installed, each plain and behind a fault
#     proxy (see below);
# exports the CHUTE_TEST_* variables the tests read, and stops everything on exit (trap).
# Needs: nginx on PATH or in /usr/sbin, and $VENV_PY with moto[server] installed.
# For benchmarks (benchsuite/remote.sh): SERVERS_WWW=DIR serves DIR instead of a scratch
# folder, SERVERS_S3=0 skips moto, and SERVERS_LATENCY_MS=N also starts a proxy that only
# delays every request by N ms (CHUTE_TEST_LATENCY_URL) and one that only forwards
# (CHUTE_TEST_PASS_URL).

servers_dir="$(mktemp -d "${TMPDIR:-/tmp}/chute-servers.XXXXXX")"
servers_pids=()

stop_servers() {
  for pid in "${servers_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  if [ -f "$servers_dir/nginx.pid" ]; then
    kill "$(cat "$servers_dir/nginx.pid")" 2>/dev/null || true
  fi
  rm -rf "$servers_dir"
}
trap stop_servers EXIT

free_port() {
  "$VENV_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # port what
  for _ in $(seq 1 100); do
    if "$VENV_PY" -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "error: $2 did not start listening on 127.0.0.1:$1" >&2
  return 1
}

NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
mkdir -p "$servers_dir/www" "$servers_dir/nginx"
# nginx workers run as an unprivileged user when started as root: they must read the files.
chmod 755 "$servers_dir" "$servers_dir/www"
www="${SERVERS_WWW:-$servers_dir/www}"
nginx_port="$(free_port)"
cat > "$servers_dir/nginx.conf" <<EOF
daemon on;
pid $servers_dir/nginx.pid;
error_log $servers_dir/nginx/error.log;
worker_processes 1;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 100000;
  client_body_temp_path $servers_dir/nginx/body;
  proxy_temp_path $servers_dir/nginx/proxy;
  fastcgi_temp_path $servers_dir/nginx/fastcgi;
  uwsgi_temp_path $servers_dir/nginx/uwsgi;
  scgi_temp_path $servers_dir/nginx/scgi;
  server {
    listen 127.0.0.1:$nginx_port;
    root $www;
  }
}
EOF
"$NGINX" -e "$servers_dir/nginx/error.log" -p "$servers_dir/nginx" -c "$servers_dir/nginx.conf"
wait_port "$nginx_port" nginx

if [ "${SERVERS_S3:-1}" = 1 ]; then
  moto_port="$(free_port)"
  "$VENV_PY" -m moto.server -H 127.0.0.1 -p "$moto_port" > "$servers_dir/moto.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$moto_port" moto
fi

proxy_port="$(free_port)"
"$VENV_PY" scripts/faultproxy.py --listen "$proxy_port" --upstream "127.0.0.1:$nginx_port" \
  --pattern "ok,503,ok,cut,429,ok,reset,ok,stall,ok" --stall-s 3 > "$servers_dir/proxy.log" 2>&1 &
servers_pids+=($!)
wait_port "$proxy_port" "the fault proxy"

if [ -n "${SERVERS_LATENCY_MS:-}" ]; then
  latency_port="$(free_port)"
  "$VENV_PY" scripts/faultproxy.py --listen "$latency_port" --upstream "127.0.0.1:$nginx_port" \
    --delay-ms "$SERVERS_LATENCY_MS" > "$servers_dir/latency.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$latency_port" "the latency proxy"
  pass_port="$(free_port)"
  "$VENV_PY" scripts/faultproxy.py --listen "$pass_port" --upstream "127.0.0.1:$nginx_port" \
    > "$servers_dir/pass.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$pass_port" "the pass-through proxy"
  export CHUTE_TEST_LATENCY_URL="http://127.0.0.1:$latency_port"
  export CHUTE_TEST_PASS_URL="http://127.0.0.1:$pass_port"
fi

# Azurite (npm, blob service in memory) and gcp-storage-emulator (pip, in the venv) for the
# az:// and gs:// tests, each also behind a fault proxy. The GCS emulator's XML API answers
# HEAD with 501 and GET without Last-Modified or ETag, which object_store requires: a proxy
# with --complete-headers fills those in (plain, and misbehaving on a schedule).
if command -v azurite-blob >/dev/null 2>&1; then
  azure_port="$(free_port)"
  azurite-blob --silent --skipApiVersionCheck --inMemoryPersistence --blobHost 127.0.0.1 \
    --blobPort "$azure_port" > "$servers_dir/azurite.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$azure_port" azurite
  azure_proxy_port="$(free_port)"
  "$VENV_PY" scripts/faultproxy.py --listen "$azure_proxy_port" --upstream "127.0.0.1:$azure_port" \
    --pattern "ok,503,ok,cut,429,ok,reset,ok" > "$servers_dir/azure-proxy.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$azure_proxy_port" "the Azure fault proxy"
  export CHUTE_TEST_AZURE_URL="http://127.0.0.1:$azure_port"
  export CHUTE_TEST_AZURE_PROXY_URL="http://127.0.0.1:$azure_proxy_port"
fi
if "$VENV_PY" -c "import gcp_storage_emulator" 2>/dev/null; then
  gcs_port="$(free_port)"
  "$VENV_PY" -m gcp_storage_emulator start --host 127.0.0.1 --port "$gcs_port" --in-memory \
    > "$servers_dir/gcs.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$gcs_port" "the GCS emulator"
  gcs_plain_port="$(free_port)"
  "$VENV_PY" scripts/faultproxy.py --listen "$gcs_plain_port" --upstream "127.0.0.1:$gcs_port" \
    --complete-headers > "$servers_dir/gcs-plain.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$gcs_plain_port" "the GCS header proxy"
  gcs_proxy_port="$(free_port)"
  "$VENV_PY" scripts/faultproxy.py --listen "$gcs_proxy_port" --upstream "127.0.0.1:$gcs_port" \
    --complete-headers --pattern "ok,503,ok,cut,429,ok,reset,ok" > "$servers_dir/gcs-proxy.log" 2>&1 &
  servers_pids+=($!)
  wait_port "$gcs_proxy_port" "the GCS fault proxy"
  export CHUTE_TEST_GCS_EMULATOR="http://127.0.0.1:$gcs_port"
  export CHUTE_TEST_GCS_URL="http://127.0.0.1:$gcs_plain_port"
  export CHUTE_TEST_GCS_PROXY_URL="http://127.0.0.1:$gcs_proxy_port"
fi

export CHUTE_TEST_HTTP_DIR="$www"
export CHUTE_TEST_HTTP_URL="http://127.0.0.1:$nginx_port"
export CHUTE_TEST_PROXY_URL="http://127.0.0.1:$proxy_port"
if [ "${SERVERS_S3:-1}" = 1 ]; then
  export CHUTE_TEST_S3_ENDPOINT="http://127.0.0.1:$moto_port"
  export CHUTE_TEST_S3_BUCKET="chute-test"
  # moto accepts any credentials; object_store needs some, and plain HTTP allowed.
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
  export AWS_ENDPOINT_URL="$CHUTE_TEST_S3_ENDPOINT" AWS_ALLOW_HTTP=true
  "$VENV_PY" -c 'import os, urllib.request; urllib.request.urlopen(urllib.request.Request(os.environ["CHUTE_TEST_S3_ENDPOINT"] + "/chute-test", method="PUT")).read()'
fi
echo "== test servers: nginx $CHUTE_TEST_HTTP_URL, moto ${CHUTE_TEST_S3_ENDPOINT:-off}, fault proxy $CHUTE_TEST_PROXY_URL, azurite ${CHUTE_TEST_AZURE_URL:-off}, gcs emulator ${CHUTE_TEST_GCS_EMULATOR:-off}"

#!/usr/bin/env bash
# Pack this machine's RabbitMQ and Erlang (Debian's rabbitmq-server 3.10.8, Erlang 25) into
# .rabbit/rabbitmq-erlang.tar.xz (ignored by git) for the lent GPU machine,
# which has no network, no RabbitMQ and no Erlang: tests/gpu/stack.sh unpacks it into /.
#
#   bash tests/gpu/pack_rabbitmq.sh            # then carry ".rabbit" in the device call
#
# The archive holds paths relative to / : /usr/lib/erlang and /usr/lib/rabbitmq (their scripts
# hard-code these roots, so they must land there), the /usr/bin and /usr/sbin entry points
# (rabbitmq-env runs `erl` from PATH), and, under opt/nebula-rabbit-libs/, the shared libraries
# an Erlang binary or NIF links against besides glibc's own (libtinfo, zlib, libcrypto.so.3 for
# crypto.so, libsystemd and its needs for epmd, ...). A stock Ubuntu 24.04 has most of them;
# stack.sh puts only the missing ones on LD_LIBRARY_PATH, so these Debian builds never shadow the
# machine's own.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUTDIR:-.rabbit}
ARCHIVE=$OUTDIR/rabbitmq-erlang.tar.xz
LIBDIR=opt/nebula-rabbit-libs

for need in /usr/lib/erlang/bin/erl /usr/lib/rabbitmq/bin/rabbitmq-server; do
  [ -e "$need" ] || { echo "missing $need: install rabbitmq-server first (apt-get install rabbitmq-server)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$LIBDIR" "$OUTDIR"

# What the stack's nodes never load: the plugins outside the closure of rabbit and the stack's
# enabled ones (broker/enabled_plugins: federation, shovel, management, auth_mechanism_ssl) over
# their .app files' applications; OTP's snmp, eldap, ftp, tftp; docs, headers, emacs mode.
P=usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins
drop=(--exclude='usr/lib/erlang/lib/*/doc' --exclude='usr/lib/erlang/man' --exclude='*/include/*.hrl'
      --exclude='usr/lib/erlang/lib/tools-*/emacs')
for d in eetcd-* gun-* jose-* base64url-* rabbitmq_peer_discovery_* rabbitmq_aws-* rabbitmq_mqtt-* \
         rabbitmq_web_mqtt* rabbitmq_stomp-* rabbitmq_web_stomp* rabbitmq_amqp1_0-* rabbitmq_stream* \
         rabbitmq_auth_backend_* rabbitmq_trust_store-* rabbitmq_tracing-* rabbitmq_top-* rabbitmq_sharding-* \
         rabbitmq_*_exchange-* rabbitmq_prometheus-*; do
  drop+=("--exclude=$P/$d")
done
for d in snmp-* eldap-* ftp-* tftp-*; do drop+=("--exclude=usr/lib/erlang/lib/$d"); done

# The entry points outside the two trees (symlinks into them, and Debian's wrappers).
extras=()
for f in /usr/bin/erl /usr/bin/erlc /usr/bin/escript /usr/bin/epmd /usr/bin/run_erl /usr/bin/to_erl \
         /usr/sbin/rabbitmqctl /usr/sbin/rabbitmq-server /usr/sbin/rabbitmq-plugins \
         /usr/sbin/rabbitmq-diagnostics /usr/share/rabbitmq; do
  if [ -e "$f" ] || [ -L "$f" ]; then extras+=("${f#/}"); fi
done
tar -cf - -C / "${drop[@]}" usr/lib/erlang usr/lib/rabbitmq "${extras[@]}" | tar -xf - -C "$stage"

# Debug info (the "Dbgi" chunk: abstract code for the debugger, xref and cover) is 60% of every
# .beam and compresses badly; the loader never reads it. Every other chunk is kept as it was
# (Attr too: RabbitMQ finds its boot steps in the modules' attributes), so module md5s are unchanged.
find "$stage" -name '*.beam' > "$stage/beams.txt"
erl -noshell -eval '
  {ok, Text} = file:read_file(hd(init:get_plain_arguments())),
  Files = string:lexemes(binary_to_list(Text), "\n"),
  Strip = fun(F) ->
      {ok, _Mod, Chunks} = beam_lib:all_chunks(F),
      case lists:keymember("Dbgi", 1, Chunks) of
          false -> ok;
          true -> {ok, Bin} = beam_lib:build_module(lists:keydelete("Dbgi", 1, Chunks)),
                  ok = file:write_file(F, Bin)
      end end,
  lists:foreach(Strip, Files),
  io:format("== debug info dropped from ~p .beam files~n", [length(Files)]),
  halt().' -extra "$stage/beams.txt"
rm "$stage/beams.txt"

# Every ELF file of the two trees, and what it links against (ldd resolves the whole chain,
# so epmd's libsystemd brings libgcrypt, liblzma, libzstd, ... too).
mapfile -t elves < <(find /usr/lib/erlang /usr/lib/rabbitmq -type f \( -perm -u+x -o -name '*.so' \) \
  -exec sh -c 'head -c4 "$1" | grep -q "ELF" && echo "$1"' _ {} \;)
echo "== ${#elves[@]} ELF files under /usr/lib/erlang and /usr/lib/rabbitmq"
# glibc itself (libc, libm, the loader, ...) is on every Linux and must match its loader; torch
# needs libstdc++ and libgcc_s, so any machine that runs it has them (and newer ones).
skip='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'
for f in "${elves[@]}"; do ldd "$f" 2>/dev/null || true; done \
  | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u \
  | while read -r soname path; do
      if [[ $soname =~ $skip ]]; then continue; fi
      cp -L "$path" "$stage/$LIBDIR/$soname"   # the file itself, under its soname
      echo "   private lib $soname <- $path"
    done

# tar's -J needs an xz binary, which minimal images may lack: wan.sh unpacks with Python's
# tarfile (lzma is in its standard library).
(cd "$stage" && XZ_OPT=${XZ_OPT:--9 -T2} tar -cJf - --owner=0 --group=0 usr opt) > "$ARCHIVE"
ls -l "$ARCHIVE" | awk '{printf "== %s: %.1f MB\n", $NF, $5 / 1e6}'

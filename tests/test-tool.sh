#!/bin/sh
# test-tool.sh - the `backplane` command-line tool against the test plugins: version, list,
# list --json (also with hostile file names, for list and run), its errors (every command
# refuses what it does not understand, with exit status 2 and its usage line) and the escaping
# of outside text in what it prints. Run by make check (automake's test driver judges the exit
# code).
set -u
tool="${top_builddir:-.}/tools/backplane"
export BP_PLUGIN_PATH="$BP_TEST_PLUGIN_DIR" BP_PLUGIN_SYSTEM_PATH= BP_LOG_LEVEL=none
pass=0
fail=0
check() { # description, command...
    desc=$1
    shift
    if "$@" >/dev/null 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc"
    fi
}
out=$("$tool" list)
json=$("$tool" list --json)
check "version prints the version" sh -c "'$tool' version | grep -q '^backplane [0-9]'"
check "list shows the loaded plugin" sh -c "echo \"\$1\" | grep -q 'loaded .*backplane-good.so'" - "$out"
check "list gives the dlopen reason" sh -c "echo \"\$1\" | grep -q 'libbpmissing.so: cannot open shared object file'" - "$out"
check "list shows both devices of good" sh -c "echo \"\$1\" | grep -q '^  GOOD1 '" - "$out"
check "list shows device memory and caps" sh -c "echo \"\$1\" | grep -q 'memory 3.0 of 4.0 MiB free, caps: events'" - "$out"
check "json has the failed records" sh -c "echo \"\$1\" | grep -q '\"status\": \"failed\"'" - "$json"
check "json has the devices" sh -c "echo \"\$1\" | grep -q '\"name\": \"GOOD0\", \"description\"'" - "$json"
check "json escapes and closes" sh -c "echo \"\$1\" | tail -n 1 | grep -q '^}$'" - "$json"
check "list and list --json give the weight types each device multiplies" sh -c "echo \"\$1\" | grep -q '^ *mul_mat: f32 .*q4_0' && echo \"\$2\" | grep -q '\"name\": \"GOOD0\".*\"mul_mat_types\": \\[\"f32\", \"f16\"'" - "$out" "$json"
check "ops: the test accelerator multiplies q8_0 but not q4_0, as its supports_op says" sh -c "BP_PLUGIN_PATH='$BP_TEST_ACCEL_PLUGIN_DIR' '$tool' ops | grep -A1 '^  ACCEL0\$' | grep -q '^    mul_mat: f32 f16 bf16 q8_0 q4_1 '"
check "a device without MUL_MAT lists no weight types (ops, list --json)" sh -c "BP_PLUGIN_PATH='$BP_TEST_ACCEL_PLUGIN_DIR' BP_TEST_ACCEL_NO_OP=MUL_MAT '$tool' ops | grep -A1 '^  ACCEL0\$' | grep -q '^    mul_mat:\$' && BP_PLUGIN_PATH='$BP_TEST_ACCEL_PLUGIN_DIR' BP_TEST_ACCEL_NO_OP=MUL_MAT '$tool' list --json | grep -q '\"name\": \"ACCEL0\".*\"mul_mat_types\": \\[\\]'"
check "BP_PLUGINS_DISABLE is honoured" sh -c "BP_PLUGINS_DISABLE=good '$tool' list | grep -q 'filtered .*backplane-good.so'"
check "list says why a lying plugin's device is not used" sh -c "BP_PLUGIN_PATH='$BP_TEST_LIAR_PLUGIN_DIR' BP_TEST_LIE=name-null '$tool' list | grep -q \"plugin 'liar': device 0 has no name (get_name returned NULL); the device is not used\""
check "list shows a lying plugin's honest device" sh -c "BP_PLUGIN_PATH='$BP_TEST_LIAR_PLUGIN_DIR' BP_TEST_LIE=name-null '$tool' list | grep -q '^  LIAR1 '"
check "unknown command exits 2" sh -c "'$tool' frobnicate; test \$? -eq 2"
check "unknown list option exits 2" sh -c "'$tool' list --yaml; test \$? -eq 2"
check "every command takes -h" sh -c "for c in version list ops run bench conformance quantize help; do '$tool' \$c -h | grep -q '^usage: backplane' || exit 1; done"
check "every help fits 80 columns" sh -c "for c in version list ops run bench conformance quantize help; do '$tool' \$c -h | awk 'length > 80 { bad = 1 } END { exit bad }' || exit 1; done"
if command -v python3 >/dev/null 2>&1; then
    check "json parses" sh -c "echo \"\$1\" | python3 -m json.tool" - "$json"
fi
if [ -w /dev/full ]; then
    check "list output to a full disk exits 1" sh -c "'$tool' list --json >/dev/full 2>/dev/null; test \$? -eq 1"
fi

# Hostile file names through every JSON output: a plugin directory whose name holds '"', '\',
# a newline, a tab, DEL and bytes that are not UTF-8 (0xff, an overlong '/', a surrogate, a
# sequence cut short), beside valid 2- and 4-byte characters, with copies of the CPU plugin
# (loaded, so `run --json` prints its path) and a junk file of the same hostile name (refused,
# listed by `list --json`). Each document must be strict JSON in strict UTF-8 and give the names
# back as they are, with U+FFFD where Python's decoder puts it.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
evil=$(printf 'x"\\\n\t\177\377|\300\257|\355\240\200|\342\202|\303\251\360\237\230\200y')
EVIL_DIR="$tmp/$evil"
export EVIL_DIR
mkdir -m 700 "$EVIL_DIR"
cp "$BP_TEST_CPU_PLUGIN_DIR"/backplane-cpu*.so "$EVIL_DIR/"
printf 'junk' > "$EVIL_DIR/backplane-$evil.so"
cat > "$tmp/strict.py" <<'PY'
import json, os, sys
raw = sys.stdin.buffer.read()
text = raw.decode("utf-8", "strict")  # bytes that are not UTF-8 raise
def no_constant(name):
    raise ValueError("not JSON: " + name)
doc = json.loads(text, parse_constant=no_constant)  # raw control characters in strings raise
json.dumps(doc, ensure_ascii=False).encode("utf-8", "strict")  # lone surrogates raise
evil_dir = os.environb[b"EVIL_DIR"]
want = evil_dir.decode("utf-8", "replace")
base = os.path.basename(evil_dir).decode("utf-8", "replace")
if sys.argv[1] == "list":
    paths = [p["path"] for p in doc["plugins"]]
    assert any(p.startswith(want + "/backplane-cpu") for p in paths), paths
    junk = [p for p in doc["plugins"] if p["path"] == want + "/backplane-" + base + ".so"]
    assert len(junk) == 1 and junk[0]["status"] == "refused", paths
else:
    assert doc["devices"][0]["plugin"].startswith(want + "/backplane-cpu"), doc["devices"]
PY
if command -v python3 >/dev/null 2>&1; then
    check "list --json gives hostile file names back in strict JSON" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' list --json | python3 '$tmp/strict.py' list"
    check "run --json gives a hostile plugin path back in strict JSON" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' run -n 2 --json | python3 '$tmp/strict.py' run"
else
    fail=$((fail + 1))
    echo "FAIL: python3 (tools/build-deps.txt) is needed to check the JSON outputs"
fi
# The same names in the text outputs: control characters come out as C escapes, so the name
# cannot start a line of its own or send DEL to the terminal.
escaped=$(printf 'x"\\\\n\\t\\x7f')
check "list prints hostile file names with escapes" sh -c "out=\$(BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' list) && printf '%s' \"\$out\" | grep -qF '$escaped' && ! printf '%s' \"\$out\" | grep -q \"\$(printf '\\177')\""
check "run prints a hostile plugin path with escapes" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' run -n 2 | grep -a '(plugin ' | grep -aqF '$escaped'"

# refused CMD ARGS...: exit status 2, a message and the command's usage line on stderr, nothing
# on stdout (nothing ran).
refused() {
    cmd=$1
    "$tool" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    test "$rc" -eq 2 && test ! -s "$tmp/out" && grep -q "^usage: backplane $cmd" "$tmp/err" &&
        test "$(grep -c '' "$tmp/err")" -ge 2
}
# Every command of the dispatcher, with an unknown option and with an argument it does not take
# (conformance takes device names: an empty one is not a name).
for c in version list ops run bench conformance quantize help; do
    check "$c refuses an unknown option" refused $c --frobnicate
    stray=stray
    [ $c = conformance ] && stray=
    check "$c refuses a stray argument" refused $c "$stray"
done
check "-h after another option prints the usage" sh -c "'$tool' list --json -h | grep -q '^usage: backplane list' && '$tool' conformance --list -h | grep -q '^usage: backplane conformance'"
check "--version refuses an argument too" sh -c "'$tool' --version x 2>&1 >/dev/null | grep -q '^usage: backplane version'"
check "the messages say which" sh -c "'$tool' ops --frob 2>&1 | grep -q \"^backplane ops: unknown option '--frob'\" && '$tool' run extra 2>&1 | grep -q \"^backplane run: unexpected argument 'extra'\""
check "an option without its value is named" sh -c "'$tool' run -d 2>&1 | grep -q '^backplane run: -d needs a value' && '$tool' bench --types 2>&1 | grep -q 'types needs a value' && '$tool' conformance --ops 2>&1 | grep -q 'ops needs a value'"
check "bench refuses an empty --types" refused bench --types ""
check "bench refuses a type named twice" sh -c "'$tool' bench --types f32,q8_0,f32 2>&1 | grep -q \"names 'f32' twice\" && { '$tool' bench --types f32,f32 >/dev/null 2>&1; test \$? -eq 2; }"
check "bench refuses an empty entry in --types" refused bench --types f32,,f16
check "bench refuses an --N value twice" refused bench --N 1,1
check "conformance refuses a case named twice" refused conformance --ops add,add
check "conformance refuses a device named twice" env BP_PLUGIN_PATH="$BP_TEST_CPU_PLUGIN_DIR" sh -c "'$tool' conformance CPU cpu --ops add 2>&1 >/dev/null | grep -q 'is named twice' && { '$tool' conformance CPU CPU --ops add >/dev/null 2>&1; test \$? -eq 2; }"
check "an empty or repeated -d entry exits 2" sh -c "'$tool' bench -d CPU,,CPU >/dev/null 2>&1; test \$? -eq 2"
check "--save-gguf refuses the options of a run" sh -c "'$tool' run --save-gguf '$tmp/never.gguf' -d NOPE0 2>&1 | grep -q -- '-d does not apply' && { '$tool' run --save-gguf '$tmp/never.gguf' -d NOPE0 >/dev/null 2>&1; test \$? -eq 2; } && test ! -e '$tmp/never.gguf'"

# Outside text with control bytes, through every route that prints it: it comes out escaped
# (ESC as \x1b), never as the raw byte a terminal would obey. Bytes that are not UTF-8 and C1
# controls (U+009B is a CSI to some terminals) are escaped too.
esc=$(printf '\033')
red=$(printf '\033[31m')
# clean FILE WANT: FILE has WANT (a fixed string) and no raw ESC, 0xff or 0xc2 0x9b.
clean() {
    grep -qF -- "$2" "$1" && ! grep -q "$esc" "$1" && ! LC_ALL=C grep -q "$(printf '\377')" "$1" &&
        ! LC_ALL=C grep -q "$(printf '\302\233')" "$1"
}
BP_LOG_LEVEL="$red" "$tool" list >/dev/null 2>"$tmp/e"
check "BP_LOG_LEVEL's value is escaped in the runtime's warning" clean "$tmp/e" "ignoring BP_LOG_LEVEL='\x1b[31m'"
"$tool" run --tokens "1,2$red" >/dev/null 2>"$tmp/e"
check "--tokens is escaped in its error" clean "$tmp/e" "token 2 ('2\\x1b[31m')"
BP_PLUGIN_PATH="$BP_TEST_CPU_PLUGIN_DIR" "$tool" conformance "NOPE$red" >/dev/null 2>"$tmp/e"
check "a conformance device name is escaped" clean "$tmp/e" "device 'NOPE\\x1b[31m'"
BP_PLUGIN_PATH="$BP_TEST_CPU_PLUGIN_DIR" "$tool" run --model tiny --save-gguf "$tmp/m$red.gguf" >"$tmp/o" 2>&1
check "the --save-gguf 'wrote' line is escaped" clean "$tmp/o" "wrote $tmp/m\\x1b[31m.gguf: model tiny"
"$tool" run --flash-attn "x$(printf '\377\302\233')y" >/dev/null 2>"$tmp/e"
check "bytes that are not UTF-8 and C1 controls are escaped" clean "$tmp/e" "not 'x\\xff\\xc2\\x9by'"
"$tool" bench "--$red" >/dev/null 2>"$tmp/e"
check "an unknown option is escaped" clean "$tmp/e" "unknown option '--\\x1b[31m'"
"$tool" "cmd$red" >/dev/null 2>"$tmp/e"
check "an unknown command is escaped" clean "$tmp/e" "unknown command 'cmd\\x1b[31m'"
"$tool" run -d "CPU$red,CPU" >/dev/null 2>"$tmp/e"
check "a -d device name is escaped" clean "$tmp/e" "device 'CPU\\x1b[31m'"
check "valid UTF-8 stays as it is" sh -c "'$tool' run --flash-attn 'é' 2>&1 | grep -qF \"not 'é'\""
echo "$pass passed, $fail failed"
test "$fail" -eq 0

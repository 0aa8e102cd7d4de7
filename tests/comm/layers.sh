#!/usr/bin/env bash
# The communicator's layers (docs/design.md, "comm/ has layers of its
# own"), held against the build: a layer reaches what is above it only
# through a hook, never by name, and comm's insides stay comm's.
#
#  - The algorithms (src/comm/algo/, but table.c, whose auto choice asks
#    the cost model) and the step executor (p2p.c) call nothing of the
#    cost model (src/comm/cost/): their real work is theirs, and a dry run
#    observes it through c->dry.
#  - The step executor, its matching of receives, the progress thread
#    and the failure handling (p2p.c, p2p_match.c, async.c, failure.c) call
#    nothing of the transports (src/comm/transport/): they wait and wake
#    through c->doorbell, and look at a link through its ops.
#  - No file of the planner or the simulator (src/plan/, src/sim/)
#    includes comm/comm_internal.h, directly or through another header.
#
# Calls are read from the library's objects (nm: a name one object needs
# and another defines); includes from the compiler (-MM).
# Usage: layers.sh CC SOURCE_DIR "OBJECT;OBJECT;..."
set -uo pipefail
CC=${1:?usage: $0 CC SOURCE_DIR OBJECTS}
SRC=${2:?usage: $0 CC SOURCE_DIR OBJECTS}
IFS=';' read -ra OBJS <<< "${3:?usage: $0 CC SOURCE_DIR OBJECTS}"
fail=0

# The objects of the sources whose path, from src/comm/, starts with $1.
objs_of() {
    local o
    for o in "${OBJS[@]}"; do [[ $o == */src/comm/$1* ]] && echo "$o"; done
}
defined() { nm -g --defined-only "$@" | awk 'NF == 3 { print $3 }' | sort -u; }
needed() { nm -u "$1" | awk '{ print $NF }' | sort -u; }

# never_calls USERS PROVIDER WHY [EXCEPT]: no object of USERS needs a name
# that an object of PROVIDER defines (EXCEPT: an object left out).
never_calls() {
    local users=$1 provider=$2 why=$3 except=${4:-} names o bad n=0 prov
    mapfile -t prov < <(objs_of "$provider")
    [[ ${#prov[@]} -gt 0 ]] || { echo "FAIL: no objects of src/comm/$provider"; fail=1; return; }
    names=$(defined "${prov[@]}")
    for o in $(objs_of "$users"); do
        [[ -n $except && $o == */src/comm/$except.o ]] && continue
        n=$((n + 1))
        bad=$(comm -12 <(needed "$o") <(echo "$names") | tr '\n' ' ')
        if [[ -n $bad ]]; then
            o=${o##*/src/}
            echo "FAIL: src/${o%.o} calls ${bad}of src/comm/$provider ($why)"
            fail=1
        fi
    done
    [[ $n -gt 0 ]] || { echo "FAIL: no objects of src/comm/$users"; fail=1; }
    echo "checked: src/comm/$users${except:+ (but $except)} -> src/comm/$provider: $n objects"
}

never_calls algo/ cost/ "the algorithms' work is theirs; a dry run observes it" algo/table.c
never_calls p2p.c cost/ "the executor hands a dry run its steps through c->dry"
for f in p2p.c p2p_match.c async.c failure.c; do
    never_calls "$f" transport/ "waiting and waking go through c->doorbell"
done

n=0
for f in "$SRC"/src/plan/*.c "$SRC"/src/sim/*.c; do
    deps=$("$CC" -MM -MG -I"$SRC/include" -I"$SRC/src" "$f") || { fail=1; continue; }
    n=$((n + 1))
    if grep -q 'comm/comm_internal\.h' <<< "$deps"; then
        echo "FAIL: ${f#"$SRC"/} includes comm/comm_internal.h (comm's insides)"
        fail=1
    fi
done
echo "checked: $n sources of src/plan/ and src/sim/ for comm/comm_internal.h"
[[ $n -gt 0 ]] || fail=1

[[ $fail == 0 ]] && echo "OK: comm's layers hold"
exit $fail

# free_port: a TCP port nobody uses now, for a test that must name its
# port itself (sourced by the shell tests; `fail` is the caller's). It is
# drawn from below Linux's ephemeral range (32768 and up), which the kernel
# never hands to a socket of its own choosing: a port taken from the
# kernel's pick and closed could go to another job's link before the test
# binds it. Another test may still draw the same port; the scripts that
# need a fixed port retry on a bind failure.
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 12000))
        if ! ss -Htan "sport = :$p" 2>/dev/null | grep -q .; then
            echo "$p"
            return 0
        fi
    done
    fail "no free port found"
}

#!/bin/bash
# The two local users of tests/adversarial/test_local_user.c, a CTest
# fixture: `setup` makes the system users kvxtest-a and kvxtest-b (no home,
# no login shell) unless they exist; `cleanup` removes them. Root only: as
# another user it says so and does nothing (the test then skips).
# Usage: tests/adversarial/local-users.sh setup|cleanup
set -euo pipefail
PATH=$PATH:/usr/sbin:/sbin
USERS="kvxtest-a kvxtest-b"
if [ "$(id -u)" != 0 ]; then
    echo "local-users.sh: not root: no test users made or removed"
    exit 0
fi
case "${1:-}" in
setup)
    for u in $USERS; do
        id -u "$u" >/dev/null 2>&1 ||
            useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$u"
        echo "local-users.sh: $u is uid $(id -u "$u")"
    done ;;
cleanup)
    for u in $USERS; do
        if id -u "$u" >/dev/null 2>&1; then userdel "$u"; fi
    done ;;
*)
    echo "usage: $0 setup|cleanup" >&2
    exit 2 ;;
esac

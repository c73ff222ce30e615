#!/bin/bash
# Generates the package changelogs from NEWS.md, the one changelog of kvxfer:
#   packaging/debian/changelog  Debian format (deb-changelog(5)), installed as
#                               changelog.Debian.gz by cmake/Packaging.cmake
#   packaging/rpm/changelog     the rpm %changelog (CPACK_RPM_CHANGELOG_FILE)
#
#   scripts/gen-changelogs.sh          rewrite both from NEWS.md
#   scripts/gen-changelogs.sh --check  exit 1, showing a diff, when a committed
#                                      changelog is not what NEWS.md generates
#                                      (the ctest `changelogs`)
#
# What NEWS.md holds, per release, newest first (text above the first release
# is free):
#   ## VERSION                                 MAJOR.MINOR.PATCH
#   Released DATE by NAME <EMAIL>              DATE as `date -R` prints it
#   - a bullet of plain text                   lines of at most 76 characters
#     continued by lines indented two spaces   (80 in the Debian file)
# Blank lines between them are free; backquotes are dropped. Every package
# gets revision 1, distribution unstable and urgency medium. Both modes check
# that format, that every DATE is well-formed with the right weekday, that
# the dates fall as the releases do, and that the newest release is
# project(VERSION) of CMakeLists.txt; with dpkg-parsechangelog installed, the
# Debian file must also parse.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C

mode="write"
case "${1:-}" in
    --check) mode=check ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

news=NEWS.md
deb_out=packaging/debian/changelog
rpm_out=packaging/rpm/changelog
die() { echo "gen-changelogs: $*" >&2; exit 1; }
[ -r "$news" ] || die "no $news"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# NEWS.md -> one line per release ("R<TAB>version<TAB>date<TAB>who") and per
# bullet line ("B<TAB>first|more<TAB>text"), or the first format error.
awk -v news="$news" '
    function bad(msg) { printf "%s:%d: %s\n", news, NR, msg > "/dev/stderr"; failed = 1; exit 1 }
    function close_release() {
        if (version != "" && !bullets) bad("release " version " has no bullet")
    }
    /^## / {
        close_release()
        if ($0 !~ /^## [0-9]+\.[0-9]+\.[0-9]+$/) bad("a release heading is \"## MAJOR.MINOR.PATCH\"")
        version = substr($0, 4); released = 0; bullets = 0; in_bullet = 0
        if (version in seen) bad("release " version " appears twice")
        seen[version] = 1
        next
    }
    version == "" { next }                       # the introduction
    /^[ \t]*$/ { in_bullet = 0; next }
    /^Released / {
        if (released || bullets) bad("one Released line per release, before its bullets")
        if (!match($0, /^Released [A-Z][a-z][a-z], [0-9][0-9] [A-Z][a-z][a-z] [0-9][0-9][0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9] [+-][0-9][0-9][0-9][0-9] by [^<>]+ <[^<> ]+@[^<> ]+>$/))
            bad("expected \"Released Sun, 06 Dec 2026 12:00:00 +0000 by NAME <EMAIL>\"")
        line = substr($0, 10)
        date = substr(line, 1, 31); who = substr(line, 36)
        printf "R\t%s\t%s\t%s\n", version, date, who
        released = 1
        next
    }
    {
        if (!released) bad("expected \"Released DATE by NAME <EMAIL>\" before the bullets of " version)
        text = $0; gsub(/`/, "", text)
        if (length($0) > 76) bad("line longer than 76 characters")
        if (index($0, "\t")) bad("a tab: indent with spaces")
        if (text ~ /^- [^ ]/) { printf "B\tfirst\t%s\n", substr(text, 3); bullets++; in_bullet = 1; next }
        if (text ~ /^  [^ ]/ && in_bullet) { printf "B\tmore\t%s\n", substr(text, 3); next }
        bad("expected a bullet (\"- text\") or its continuation (two spaces, no blank line before)")
    }
    END { if (!failed) { if (version == "") bad("no release"); close_release() } }
' "$news" >"$work/items"

# Dates: well-formed, the right weekday, newest first.
prev=""
while IFS=$'\t' read -r _ version date _; do
    day=${date:5:11}                                # "06 Dec 2026"
    secs=$(date -d "${date:5}" +%s 2>/dev/null) || die "release $version: '$date' is not a date"
    [ "$(date -d "$day" +%a)" = "${date:0:3}" ] || die "release $version: $day is a $(date -d "$day" +%A), not '${date:0:3}'"
    if [ -n "$prev" ] && [ "$secs" -gt "$prev" ]; then die "release $version is dated after the release above it"; fi
    prev=$secs
done < <(grep '^R' "$work/items")
newest=$(awk -F'\t' '$1 == "R" { print $2; exit }' "$work/items")
project=$(sed -n 's/^project(kvxfer VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ "$newest" = "$project" ] || die "the newest release in $news is $newest, CMakeLists.txt says $project: add its entry"

# Debian: "kvxfer (V-1) unstable; urgency=medium", the bullets as "  * ", the
# trailer " -- NAME <EMAIL>  DATE", entries apart by a blank line.
awk -F'\t' '
    function trailer() { if (who != "") printf "\n -- %s  %s\n", who, date }
    $1 == "R" { trailer(); if (who != "") print ""; printf "kvxfer (%s-1) unstable; urgency=medium\n\n", $2; date = $3; who = $4; next }
    $2 == "first" { print "  * " $3; next }
    { print "    " $3 }
    END { trailer() }
' "$work/items" >"$work/debian"

# rpm: "* Www Mmm DD YYYY NAME <EMAIL> - V-1", the bullets as "- ".
awk -F'\t' '
    $1 == "R" {
        split($3, d, /[ ,]+/)                       # Sun, 06 Dec 2026 ...
        if (n++) print ""
        printf "* %s %s %s %s %s - %s-1\n", d[1], d[3], d[2], d[4], $4, $2
        next
    }
    $2 == "first" { print "- " $3; next }
    { print "  " $3 }
' "$work/items" >"$work/rpm"

if command -v dpkg-parsechangelog >/dev/null; then
    dpkg-parsechangelog -l "$work/debian" --all >/dev/null || die "dpkg-parsechangelog refuses the generated Debian changelog"
fi

if [ "$mode" = check ]; then
    stale=0
    for f in debian rpm; do
        out=$deb_out
        [ $f = rpm ] && out=$rpm_out
        if ! cmp -s "$work/$f" "$out"; then
            echo "gen-changelogs: $out is not what $news generates; run $0 and commit the result:" >&2
            diff -u "$out" "$work/$f" | head -n 40 >&2 || true
            stale=1
        fi
    done
    [ $stale -eq 0 ] || exit 1
    echo "gen-changelogs: $deb_out and $rpm_out are up to date with $news"
    exit 0
fi
cat "$work/debian" >"$deb_out"
cat "$work/rpm" >"$rpm_out"
echo "gen-changelogs: wrote $deb_out and $rpm_out from $news"

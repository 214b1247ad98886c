
# ---- @ID@
if @SETUP@; then
  dmsetup table bench 2> /dev/null | sed -E 's/ [0-9a-f]{32,} / <key> /' > raw/@ID@.table 2> /dev/null || true
@FIO_RUNS@
  @TEARDOWN@
  echo "STATUS @ID@ ok"
else
  echo "STATUS @ID@ failed setup: $(tail -n2 /tmp/setup.err 2> /dev/null | tr '\n' ' ')"
fi

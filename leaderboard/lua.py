"""Lua shared by the Redis scripts of the speed and serving layers.

Lua's string comparisons (`<`, `>`) call `strcoll`, so inside Redis they follow the server's
LC_COLLATE, which Redis takes from its environment at start: under en_US.UTF-8, 'a-7' sorts
before 'B-7', where DuckDB, Arrow and Python (the batch) compare bytes and put it after. A
script that orders text does it with `bytes_after`, the batch's order on any server, whatever
locale it was started with (a managed Redis or a Cluster's nodes are not ours to start).
"""

from __future__ import annotations

__all__ = ["BYTES_AFTER"]

#: Defines `bytes_after(a, b)`: whether text a sorts after text b byte by byte (unsigned
#: bytes, a prefix first), as `a > b` does in DuckDB, Arrow and Python. Prepend it to a
#: script's source. Equal texts (the common case of two marks) cost one interned compare;
#: else the common prefix is skipped four bytes a call (one `string.byte` call a byte was
#: three times the cost: a `last` mark's 20-digit times share their first ~10 digits), a
#: byte past the shorter text counting as -1.
BYTES_AFTER = """
local byte = string.byte
local function bytes_after(a, b)
  if a == b then return false end
  local n = #a
  if #b < n then n = #b end
  for i = 1, n, 4 do
    local a1, a2, a3, a4 = byte(a, i, i + 3)
    local b1, b2, b3, b4 = byte(b, i, i + 3)
    if a1 ~= b1 then return a1 > b1 end
    if a2 ~= b2 then return (a2 or -1) > (b2 or -1) end
    if a3 ~= b3 then return (a3 or -1) > (b3 or -1) end
    if a4 ~= b4 then return (a4 or -1) > (b4 or -1) end
  end
  return #a > #b
end
"""

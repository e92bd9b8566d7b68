#!lua name=kvtier
-- SPDX-License-Identifier: Apache-2.0
-- kvtier's per-tenant budget ledger, a Redis Functions library (Redis 7.0
-- and later; the tests run it on Debian's redis-server 7.0.15, Valkey is not
-- run here). An administrator loads it on every primary (FUNCTION LOAD
-- REPLACE; replicas get it by replication); tenants' ACL users
-- may call it (+fcall) but not run scripts of their own (no +eval): a script
-- runs outside maxmemory and can hold a node busy for every tenant.
--
-- keys[1]: the ledger, a sorted set of "<bytes>:<namespace>:<block>" entries
-- (64 lowercase hex digits each) by a sequence number, the oldest first;
-- keys[2]: a hash of the bytes those add up to ("used") and the last
-- sequence number ("seq"). Both under the tenant's own key pattern, in one
-- slot ({<tenant>}), so every command below is checked against the caller's
-- ACL: a tenant can only ever change its own ledger.
-- args[1]: the budget; args[2]: n; args[3 .. 2+n]: entries written now
-- (counted once, moved to the young end); the rest: entries read now (moved
-- to the young end if still there). Pops the oldest entries while the tenant
-- is past its budget (at most 2048 a call) and returns them: the caller
-- deletes their blocks. An entry of another shape counts 0 bytes; a count
-- that is missing or not a number drains the ledger (below).
-- (The library's top level may only register functions: the standard
-- libraries are there when a function runs, so the pattern is made then.)
local shape = nil
local function size(m)
  if shape == nil then
    local hex = string.rep('[0-9a-f]', 64)
    shape = '^(%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?):' .. hex .. ':' .. hex .. '$'
  end
  local v = tonumber(string.match(m, shape)) or 0
  -- No block is near 4 GiB (max_block_bytes is 64 MiB by default): a larger
  -- size is no entry of ours and could drain the count when popped.
  if v > 4294967296 then return 0 end
  return v
end
-- A number in [0, 1e15], or nil.
local function sane(v)
  v = tonumber(v)
  if v == nil or v ~= v or v < 0 or v > 1e15 then return nil end
  return v
end
local function ledger(keys, args)
  -- kvtierd sends at most 1 + 4096 entries; more would hold the node.
  if #args > 8194 then return redis.error_reply('ERR kvtier ledger: too many entries in one call') end
  local budget = sane(args[1]) or 0
  local n = sane(args[2]) or 0
  local h = redis.call('HMGET', keys[2], 'used', 'seq')
  local out = {}
  local used = sane(h[1])
  if used == nil then
    -- No count, or one that is not a number (the hash lost, or written by
    -- someone with the tenant's password): the ledger's entries cannot be
    -- trusted to add up, so they go (1024 a call), the tenant's blocks with
    -- them, and the count starts again from an empty ledger. Never fewer
    -- bytes counted than the entries hold; no command that walks the set.
    while #out < 1024 do
      local p = redis.call('ZPOPMIN', keys[1])
      if #p == 0 then break end
      out[#out + 1] = p[1]
    end
    if #out < 1024 then used = 0 else used = 1e15 end
  end
  -- A sequence number out of range restarts above any that was handed out.
  local seq = sane(h[2]) or 9e14
  for i = 3, 2 + n do
    seq = seq + 1
    if not redis.call('ZSCORE', keys[1], args[i]) then used = used + size(args[i]) end
    redis.call('ZADD', keys[1], seq, args[i])
  end
  for i = 3 + n, #args do
    seq = seq + 1
    redis.call('ZADD', keys[1], 'XX', seq, args[i])
  end
  while used > budget and #out < 2048 do
    local p = redis.call('ZPOPMIN', keys[1])
    if #p == 0 then
      used = 0
      break
    end
    used = used - size(p[1])
    out[#out + 1] = p[1]
  end
  if used < 0 then used = 0 end
  redis.call('HSET', keys[2], 'used', used, 'seq', seq)
  return out
end

redis.register_function('kvtier_ledger_v1', ledger)

-- meridian's prelude: trusted code, run once in each script's Lua state before the script is
-- compiled. It keeps the real functions in locals the script cannot reach, builds the library
-- the script sees (lib.rs says what it holds and why), and returns what the Rust side calls:
--
--   new_env()  a fresh environment for one decision (the script's globals never outlive it)
--   freeze(t)  a read-only view of an input table (and of the tables in it)
--   run(chunk, env, protos, n, workload, out)
--              one decision: the chunk's top level, then filter/score for protos[1..n]
--              (frozen cluster tables) with `workload` (frozen here);
--              out[i] = true (kept, no score) | a number (kept, its score) | a string (rejected,
--              the reason); returns nil, false (neither function defined) or a string (a
--              result that breaks the contract, explained)
--   st         what run is doing (phase, i), read by Rust when a call fails
local h = ...
local too_complex, plain_too_complex, rep_too_big, too_many, tripped =
    h.too_complex, h.plain_too_complex, h.rep_too_big, h.too_many, h.tripped

local next, type, select, error, tostring, rawget, getmetatable, setmetatable, pcall, pairs =
    next, type, select, error, tostring, rawget, getmetatable, setmetatable, pcall, pairs
-- Named as the script knows them: Lua's argument errors name the local a function was called
-- through (`bad argument #1 to 'rep'`).
local find, match, gmatch, gsub, rep =
    string.find, string.match, string.gmatch, string.gsub, string.rep
local sort, move, insert, remove = table.sort, table.move, table.insert, table.remove

-- Strings' methods (`s:find(p)`) come from the decision's own `string` table (new_env), and
-- getmetatable("") answers false: the shared metatable is not the script's to change.
local string_mt = getmetatable("")
string_mt.__metatable = false
string.dump = nil

-- Calls whose C work is not bounded by their arguments' size: refused past a bound, and past a
-- lower one they look at the clock first (the instruction hook does not fire inside C).
local function pattern(s, p, anchorable)
  if type(s) == "string" and type(p) == "string" then
    local why = too_complex(#s, p, anchorable)
    if why then error(why, 3) end
  end
end

local function elements(count)
  if type(count) == "number" then
    local why = too_many(count)
    if why then error(why, 3) end
  end
end

local lib = {}

lib.string = {
  byte = string.byte, char = string.char, format = string.format, len = string.len,
  lower = string.lower, upper = string.upper, reverse = string.reverse, sub = string.sub,
  pack = string.pack, packsize = string.packsize, unpack = string.unpack,
  find = function(s, p, init, plain)
    if plain then
      if type(s) == "string" and type(p) == "string" then
        local why = plain_too_complex(#s, #p)
        if why then error(why, 2) end
      end
    else
      pattern(s, p, true)
    end
    return find(s, p, init, plain)
  end,
  match = function(s, p, init)
    pattern(s, p, true)
    return match(s, p, init)
  end,
  gmatch = function(s, p, init)
    pattern(s, p, false)
    return gmatch(s, p, init)
  end,
  gsub = function(s, p, repl, n)
    pattern(s, p, true)
    return gsub(s, p, repl, n)
  end,
  rep = function(s, n, sep)
    if type(s) == "string" and type(n) == "number" and n > 1 then
      local why = rep_too_big(#s, n, type(sep) == "string" and #sep or 0)
      if why then error(why, 2) end
    end
    return rep(s, n, sep)
  end,
}

lib.table = {
  concat = table.concat, pack = table.pack, unpack = table.unpack,
  sort = function(t, comp)
    if type(t) == "table" then elements(#t) end
    return sort(t, comp)
  end,
  move = function(a1, f, e, t, a2)
    if type(f) == "number" and type(e) == "number" then elements(e - f + 1) end
    return move(a1, f, e, t, a2)
  end,
  insert = function(t, ...)
    if select("#", ...) == 2 and type(t) == "table" and type((...)) == "number" then
      elements(#t - (...))
    end
    return insert(t, ...)
  end,
  remove = function(t, ...)
    if select("#", ...) >= 1 and type(t) == "table" and type((...)) == "number" then
      elements(#t - (...))
    end
    return remove(t, ...)
  end,
}

-- Decisions are deterministic: no random numbers.
lib.math = {}
for k, v in next, math do
  if k ~= "random" and k ~= "randomseed" then lib.math[k] = v end
end

lib.utf8 = {}
for k, v in next, utf8 do lib.utf8[k] = v end

-- The inputs are read-only views: an empty table whose metatable reads through to the real
-- one (which the script never sees) and refuses writes. So the cluster tables can be built
-- once per cluster state and shared by every decision (copying them each time cost more than
-- the script), and no decision sees what an earlier one did to them. `backing` maps each view
-- to its table, for the functions that would otherwise see the empty view: pairs, next,
-- rawget, rawlen (and rawset, which refuses).
local backing = setmetatable({}, { __mode = "k" })

local READ_ONLY = "the cluster and workload tables are read-only"

local function read_only()
  error(READ_ONLY, 2)
end

local function view_len(view)
  return #backing[view]
end

local function freeze(t)
  for k, v in next, t do
    if type(v) == "table" then t[k] = freeze(v) end
  end
  local view = setmetatable({}, {
    __index = t,
    __newindex = read_only,
    __len = view_len,
    __metatable = false,
  })
  backing[view] = t
  return view
end

-- pairs visits keys in a fixed order (numbers, then strings in byte order, then false, true,
-- then any other keys), not in hash order: Lua seeds its string hash per state, so hash order
-- differs between two states of the same script. A table with a __pairs metamethod decides
-- for itself.
local function sorted_keys(t)
  local strs, ns, nums, nn, rest, nr = {}, 0, nil, 0, nil, 0
  local has_false, has_true = false, false
  for k in next, t do
    local ty = type(k)
    if ty == "string" then
      ns = ns + 1
      strs[ns] = k
    elseif ty == "number" then
      nums = nums or {}
      nn = nn + 1
      nums[nn] = k
    elseif k == false then
      has_false = true
    elseif k == true then
      has_true = true
    else
      rest = rest or {}
      nr = nr + 1
      rest[nr] = k
    end
  end
  if ns > 1 then sort(strs) end
  if nums == nil and rest == nil and not has_false and not has_true then return strs, ns end
  local keys, n = {}, 0
  if nums then
    sort(nums)
    for i = 1, nn do n = n + 1; keys[n] = nums[i] end
  end
  for i = 1, ns do n = n + 1; keys[n] = strs[i] end
  if has_false then n = n + 1; keys[n] = false end
  if has_true then n = n + 1; keys[n] = true end
  for i = 1, nr do n = n + 1; keys[n] = rest[i] end
  return keys, n
end

local function ordered_pairs(t)
  if type(t) ~= "table" then return pairs(t) end
  t = backing[t] or t
  local mt = getmetatable(t)
  if type(mt) == "table" and rawget(mt, "__pairs") ~= nil then return pairs(t) end
  local keys, n = sorted_keys(t)
  local i = 0
  return function()
    while i < n do
      i = i + 1
      local k = keys[i]
      local v = rawget(t, k)
      if v ~= nil then return k, v end
    end
    return nil
  end, t, nil
end

-- pcall cannot catch a limit: once one is hit the error goes on up, whatever the script does.
-- mlua's own error values (userdata) reach the script as their message.
local function caught(ok, ...)
  if ok then return true, ... end
  if tripped() then error((...), 0) end
  local e = ...
  if type(e) == "userdata" then e = tostring(e) end
  return false, e
end

local rawlen, rawset = rawlen, rawset

-- The metatables setmetatable really sets, each mapped to the table the script passed: what
-- getmetatable shows it. The real one is a copy out of the script's reach (see setmetatable).
local shown = setmetatable({}, { __mode = "k" })

local base = {
  assert = assert, error = error, ipairs = ipairs,
  getmetatable = function(v)
    local mt = getmetatable(v)
    return shown[mt] or mt
  end,
  rawequal = rawequal, select = select, tonumber = tonumber, tostring = tostring, type = type,
  _VERSION = _VERSION,
  pairs = ordered_pairs,
  next = function(t, k) return next(backing[t] or t, k) end,
  rawget = function(t, k) return rawget(backing[t] or t, k) end,
  rawlen = function(t) return rawlen(backing[t] or t) end,
  rawset = function(t, k, v)
    if backing[t] then error(READ_ONLY, 2) end
    return rawset(t, k, v)
  end,
  pcall = function(f, ...) return caught(pcall(f, ...)) end,
  -- A finalizer (__gc) runs inside the collector, and a to-be-closed variable's __close while
  -- an error (a limit's among them) unwinds: in both Lua runs no instruction hook, so no
  -- limit could stop them. Both are refused, and the metatable set is a copy the script
  -- cannot reach (getmetatable shows it the table it passed), so neither can be added
  -- afterwards. (Changing that table later changes nothing; its __index tables still do.)
  setmetatable = function(t, mt)
    if type(mt) == "table" then
      if rawget(mt, "__gc") ~= nil then
        error("__gc metamethods are not allowed in a placement script", 2)
      end
      if rawget(mt, "__close") ~= nil then
        error("__close metamethods are not allowed in a placement script", 2)
      end
      local real = {}
      for k, v in next, mt do real[k] = v end
      shown[real] = mt
      mt = real
    end
    return setmetatable(t, mt)
  end,
}

local function copy(t)
  local c = {}
  for k, v in next, t do c[k] = v end
  return c
end

local function new_env()
  local env = copy(base)
  local str = copy(lib.string)
  env.string, env.table, env.math, env.utf8 = str, copy(lib.table), copy(lib.math), copy(lib.utf8)
  env._G = env
  string_mt.__index = str
  return env
end

-- Nothing else in this state is the script's: the real globals go.
local G = _G
for k in next, G do G[k] = nil end

local function describe(v)
  if v == nil then return "nil" end
  return "a " .. type(v)
end

local st = { phase = "inputs", i = 0 }

local function run(chunk, env, protos, n, workload, out)
  st.phase, st.i = "top", 0
  chunk()
  local filter, score = rawget(env, "filter"), rawget(env, "score")
  if filter == nil and score == nil then return false end
  if filter ~= nil and type(filter) ~= "function" then
    return "filter is " .. describe(filter) .. ", not a function"
  end
  if score ~= nil and type(score) ~= "function" then
    return "score is " .. describe(score) .. ", not a function"
  end
  workload = workload and freeze(workload)
  for i = 1, n do
    local c = protos[i]
    st.i = i
    local verdict = true
    if filter then
      st.phase = "filter"
      local ok, why = filter(c, workload)
      if ok == false then
        if why == nil then
          verdict = ""
        elseif type(why) == "string" then
          verdict = why
        else
          return "filter() returned false and " .. describe(why) .. " for cluster " .. c.name
            .. "; a reason must be a string"
        end
      elseif ok ~= true then
        return "filter() returned " .. describe(ok) .. " for cluster " .. c.name
          .. "; it must return a boolean (and optionally a reason)"
      end
    end
    if verdict == true and score then
      st.phase = "score"
      local s = score(c, workload)
      if type(s) ~= "number" then
        return "score() returned " .. describe(s) .. " for cluster " .. c.name
          .. "; it must return a number in [0, 100]"
      end
      if s ~= s then
        return "score() returned NaN for cluster " .. c.name .. ", outside [0, 100]"
      end
      if s < 0 or s > 100 then
        return "score() returned " .. tostring(s) .. " for cluster " .. c.name
          .. ", outside [0, 100]"
      end
      verdict = s
    end
    out[i] = verdict
  end
  st.phase = "done"
  return nil
end

return { new_env = new_env, freeze = freeze, run = run, st = st }

-- wrk's script for tests/gpu/load.sh: each request posts the next body of a
-- file (one JSON body a line) to /v1/embeddings. Thread k of n takes the
-- bodies k, k + n, k + 2n, ... in turn, so that no two requests in flight
-- are the same while a thread has fewer connections than bodies: the server
-- coalesces identical requests in flight. Each thread starting at its own
-- place in the whole file was not enough: threads drift, one caught up with
-- another, and from then on they sent the same bodies together (wrk counted
-- 249,341 answers over 5 s where the server ran 191,793 texts).
-- At the end: one line "LOAD requests duration_us not_2xx socket_errors
-- p50_us p99_us".

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  -- args[2]: how many threads share the file.
  local threads = tonumber(args[2] or 8)
  local all = {}
  for line in io.lines(args[1]) do
    all[#all + 1] = line
  end
  bodies = {}
  for i = 1, #all do
    if (i - 1) % threads == id then
      bodies[#bodies + 1] = all[i]
    end
  end
  if #bodies == 0 then
    bodies = all
  end
  counter = 0
  headers = { ["Content-Type"] = "application/json" }
end

function request()
  counter = counter + 1
  return wrk.format("POST", "/v1/embeddings", headers, bodies[(counter % #bodies) + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("LOAD %d %d %d %d %d %d\n", summary.requests, summary.duration, e.status,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99)))
end

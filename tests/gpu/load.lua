-- wrk's script for tests/gpu/load.sh: each request posts the next body of a
-- file (one JSON body a line) to /v1/embeddings, each thread starting at its
-- own place in the file, so that no two requests in flight are the same.
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
  bodies = {}
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  -- args[2]: how many threads share the file, each starting at its own place.
  counter = math.floor(#bodies * id / tonumber(args[2] or 8))
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

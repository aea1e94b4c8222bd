-- unregister: a worker that stops cleanly removes its registration.
-- KEYS[1] workers
-- KEYS[2] workers_seen
-- ARGV[1] worker     the worker's id
-- REPLY registered
-- Returns: 1 if it was registered.
redis.call('HDEL', K.workers, A.worker)
return redis.call('ZREM', K.workers_seen, A.worker)

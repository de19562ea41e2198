"""Internal: what goes over the wire and what is stored in Redis.

``keys`` names every key of a queue (one hash tag per queue or shard); ``envelope`` the stored
form of a task; ``protocol`` the one Python owner of each Lua script (its key order, arguments,
reply and status codes); ``scripts`` loads ``lua/`` and runs it; ``snapshot`` and ``failures``
read stored replies back into values; ``server_check`` judges the server's version and policy.
"""

"""Internal: how deliveries reach a consumer.

``rules`` holds the claim rules both consumers share (how many to ask for, when to wait),
``prefetch`` the local buffer of claimed tasks, ``wake`` the Pub/Sub wake channel and its timer,
``ended`` the shared subscription ``q.wait`` listens on; ``threads`` is the thread consumer
behind ``Queue.observe`` and ``aio`` its asyncio twin behind ``AsyncQueue.observe``.
"""

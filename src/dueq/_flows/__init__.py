"""Internal: every queue operation written once, as a generator flow both front ends drive.

``drive`` holds the flow type and its two drivers (blocking and asyncio); ``base`` a queue's
settings, keys and server checks; ``schedule``, ``lease``, ``view``, ``settings`` and
``registry`` the flows of one concept each; ``core`` puts them together as ``QueueCore``.
The flows only yield protocol steps (``dueq._wire.protocol``) and judge the replies: no I/O.
"""

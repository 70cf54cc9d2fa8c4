"""The primitives written once, without I/O: what a lock and a semaphore check, keep
and ask their backend for. The sync surface (``stock_locks.locks``,
``stock_locks.semaphores``) and the asyncio one (``stock_locks.aio``) are siblings
over these cores: each drives the same steps with its own driver."""

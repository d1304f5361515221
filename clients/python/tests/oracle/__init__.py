"""The oracle: a seeded, randomized end-to-end test of the library against real servers.

Many holders (asyncio tasks and threads in the test process, threads in worker processes) take
and leave holds on a few keys, in random sequences; every critical section writes through
``guard.execute`` (LOCK.GUARD). Meanwhile a disruptor ends holds from outside (SIGKILL and
SIGSTOP of worker processes, CLIENT KILL, LOCK.FORCERELEASE, DEL, COPY and DEL of the copy,
FLUSHDB, and in a cluster slot migration), and forges messages that end nothing (a lost message
naming a live hold, leader messages naming a candidate never elected, with a huge epoch); an
observer follows the election key. Every holder records what it believes and when; a
truth keeper reads what the server holds every few milliseconds, in one MULTI with the writes
that landed since, and runs each disruption inside such a MULTI, between two reads. The
analysis compares belief with truth:

- **false lost**: a guard reported lost while the server still held its (owner, token) —
  checked by the reporting callback itself with ``LOCK.CHECK`` before it returns;
- **false held**: a guard not reporting a loss while the server no longer held its hold —
  a duration per case, with its cause and the bound that cause allows;
- **stale writes**: a write through a guard that landed after its hold had ended, and on an
  exclusive key a write whose token is below one that landed before it;
- **unelected**: a leader the observer yielded that the server never elected (a candidate and
  epoch no holder was granted and no read saw).

``holders.py`` (what a holder does), ``worker.py`` (a worker process), ``truth.py`` (the truth
keeper and the disruptions it runs), ``analysis.py`` (the comparison), ``run.py`` (one seed,
and the command line of ``make oracle-python``).
"""

import threading

from ipybox.utils import arun


async def test_arun_runs_in_a_worker_thread() -> None:
    main = threading.get_ident()
    result = await arun(lambda a, b=0: (a + b, threading.get_ident()), 1, b=2)
    assert result[0] == 3
    assert result[1] != main

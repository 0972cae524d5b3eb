"""The proxy suite: what the sandbox's proxy adds to HTTPS when it terminates TLS to put secrets in."""

from bench.registry import Job, Metric, Side, Suite, register

register(
    Suite(
        name="proxy",
        description="the sandbox proxy's TLS interception (secrets) against a plain CONNECT tunnel",
        jobs=(
            Job(
                "proxy_interception.py",
                (Side.OURS,),
                runs=200,
                metrics=(
                    # The tunnel to the same origin, interleaved with the intercepted samples.
                    Metric("proxy.tunnel.request", "request on a kept-alive CONNECT tunnel", floor=True),
                    Metric("proxy.tunnel.connect", "new CONNECT tunnel + TLS + one request", floor=True),
                    Metric("proxy.intercept.request", "request on a kept-alive intercepted connection"),
                    Metric("proxy.intercept.connect", "new intercepted connection + TLS + one request"),
                    Metric("proxy.intercept.request_added", "interception minus tunnel, kept-alive (pairs)"),
                    Metric(
                        "proxy.intercept.connect_added", "interception minus tunnel, new connection (pairs)"
                    ),
                ),
            ),
        ),
    )
)

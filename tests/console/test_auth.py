"""`ConsoleAuth`: login tokens work once and not for long, sessions end, and neither grows without bound."""

from __future__ import annotations

from ipybox.console.auth import LOGIN_TTL_S, MAX_LOGIN_TOKENS, MAX_SESSIONS, SESSION_TTL_S, ConsoleAuth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_login_token_is_spent_on_first_use() -> None:
    auth = ConsoleAuth()
    token = auth.new_login_token()
    assert auth.spend_login_token(token)
    assert not auth.spend_login_token(token)


def test_a_login_token_expires() -> None:
    clock = Clock()
    auth = ConsoleAuth(clock)
    token = auth.new_login_token()
    clock.now += LOGIN_TTL_S
    assert not auth.spend_login_token(token)


def test_unknown_and_empty_tokens_are_refused() -> None:
    auth = ConsoleAuth()
    auth.new_login_token()
    assert not auth.spend_login_token("")
    assert not auth.spend_login_token("x" * 43)


def test_links_asked_for_over_and_over_keep_only_the_newest() -> None:
    auth = ConsoleAuth()
    tokens = [auth.new_login_token() for _ in range(MAX_LOGIN_TOKENS + 10)]
    assert not auth.spend_login_token(tokens[0])
    assert auth.spend_login_token(tokens[-1])


def test_a_session_ends_after_its_time_and_when_the_console_stops() -> None:
    clock = Clock()
    auth = ConsoleAuth(clock)
    session_id, session = auth.new_session()
    assert auth.session(session_id) is session
    clock.now += SESSION_TTL_S
    assert auth.session(session_id) is None
    session_id, _ = auth.new_session()
    auth.end_sessions()
    assert auth.session(session_id) is None


def test_sessions_beyond_the_limit_drop_the_oldest() -> None:
    auth = ConsoleAuth()
    ids = [auth.new_session()[0] for _ in range(MAX_SESSIONS + 1)]
    assert auth.session(ids[0]) is None and auth.session(ids[-1]) is not None


def test_a_sessions_csrf_token_matches_only_itself() -> None:
    auth = ConsoleAuth()
    _, session = auth.new_session()
    _, other = auth.new_session()
    assert session.csrf_matches(session.csrf)
    assert not session.csrf_matches(other.csrf)
    assert not session.csrf_matches(None) and not session.csrf_matches("")
    assert not session.csrf_matches(session.csrf + "\udcff")  # undecodable form input is no match, no crash

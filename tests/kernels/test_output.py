from pathlib import Path

from ipybox.kernels.output import BoundedText, OutputCollector, strip_ansi


def test_strip_ansi_removes_colours_and_titles() -> None:
    assert strip_ansi("\x1b[31mred\x1b[0m \x1b]0;title\x07plain") == "red plain"
    assert strip_ansi("no escapes") == "no escapes"


def test_bounded_text_keeps_everything_under_the_limit() -> None:
    text = BoundedText(10)
    assert text.append("12345") is None
    assert text.append("67890") is None
    assert text.render("NOTICE") == "1234567890"
    assert not text.overflowed


def test_bounded_text_returns_the_whole_text_once_and_keeps_head_and_tail() -> None:
    text = BoundedText(10)
    text.append("abcdefgh")
    assert text.append("ijkl") == "abcdefghijkl"
    assert text.append("mnop") is None
    assert text.size == 16
    assert text.render("[cut]") == "abcde\n[cut]\nlmnop"


def test_bounded_text_without_tail_keeps_the_first_limit_characters_only() -> None:
    text = BoundedText(10, tail=False)
    text.append("abcdefgh")
    assert text.append("ijkl") == "abcdefghijkl"
    assert text.append("mnop") is None
    assert text.render("[cut]") == "abcdefghij\n[cut]\n"


def test_bounded_text_tail_stays_bounded_with_many_small_appends() -> None:
    text = BoundedText(100)
    for i in range(10_000):
        text.append(f"{i}\n")
    rendered = text.render("[cut]")
    assert rendered.startswith("0\n1\n")
    assert rendered.endswith("9998\n9999\n")
    assert len(rendered) <= 100 + len("\n[cut]\n")


def test_the_complete_output_stops_at_whole_characters_and_has_no_lone_surrogate(tmp_path: Path) -> None:
    collector = OutputCollector(limit=4, images_dir=tmp_path / "img", output_dir=tmp_path, max_file_bytes=8)
    collector.add_text("a\ud800é")  # 1 + 3 (U+FFFD) + 2 bytes
    collector.add_text("éé")  # the first fits whole (8 bytes), the second not at all
    collector.add_text("more")  # past the limit: not written
    result = collector.result()
    assert result.output_file is not None and result.text is not None
    head, notice = result.output_file.read_text().split("\n", 1)
    assert head == "a\ufffdéé" and notice.startswith("[ipybox: the complete output stops here: it reached ")
    assert "only its first 8 B were saved" in result.text and "max_output_file_bytes (8 B)" in result.text


def test_collector_spills_complete_output_to_a_file(tmp_path: Path) -> None:
    collector = OutputCollector(limit=50, images_dir=tmp_path / "img", output_dir=tmp_path / "out")
    parts = [f"line {i}\n" for i in range(100)]
    for part in parts:
        collector.add_text(part, "stdout")
    collector.add_text("oops\n", "stderr")
    result = collector.result()
    assert result.output_file is not None and result.truncated
    assert result.output_file.read_text() == "".join(parts) + "oops\n"
    assert result.text is not None
    total = sum(map(len, parts)) + len("oops\n")
    assert f"output truncated: {total:,} characters in total" in result.text
    assert str(result.output_file) in result.text
    assert result.text.startswith("line 0\n")
    assert result.text.endswith("oops")
    assert result.stderr == "oops"


def test_collector_separates_streams_and_strips_escape_codes(tmp_path: Path) -> None:
    collector = OutputCollector(limit=1000, images_dir=tmp_path, output_dir=tmp_path)
    collector.add_text("\x1b[32mout\x1b[0m\n", "stdout")
    collector.add_text("err\n", "stderr")
    collector.add_result({"text/plain": "42"})
    result = collector.result()
    assert result.text == "out\nerr\n42"
    assert result.stdout == "out\n42"
    assert result.stderr == "err"
    assert result.output_file is None


def test_collector_saves_images_instead_of_their_text(tmp_path: Path) -> None:
    collector = OutputCollector(limit=1000, images_dir=tmp_path / "images", output_dir=tmp_path)
    png = "iVBORw0KGgo="  # base64 of the PNG signature
    collector.add_result({"image/png": png, "text/plain": "<Figure>"})
    collector.add_result({"image/svg+xml": "<svg/>", "text/plain": "<SVG>"})
    result = collector.result()
    assert result.text is None
    assert [p.suffix for p in result.images] == [".png", ".svg"]
    assert result.images[0].read_bytes() == b"\x89PNG\r\n\x1a\n"
    assert result.images[1].read_text() == "<svg/>"

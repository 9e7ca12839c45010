"""What the command tests share."""

from hasten.cli import main


def exit_status(argv) -> int:
    """``hasten ARGV``'s exit status: main's return value, or argparse's for an option it rejected."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code

from grtool.cli.main import run

run()

from grtool.cli.main import run

if __name__ == "__main__":  # multiprocessing (vLLM's engine) re-imports the main module in its workers
    run()

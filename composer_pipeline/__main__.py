from composer_pipeline.cli import run

run()

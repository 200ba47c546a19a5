"""Log a directory as MLflow run artifacts and print the seconds it took (runs in MLflow's venv).

Only the standard library and mlflow are imported; `benchmarks/artifacts.py` starts it with the
venv's python: ``--tracking DIR --src DIR [--s3 s3://bucket/prefix]`` (for S3, set
MLFLOW_S3_ENDPOINT_URL and AWS credentials in the environment).
"""

from __future__ import annotations

import argparse
import json
import time

import mlflow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tracking", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--s3", default=None)
    args = p.parse_args()
    # MLflow 3 refuses the file tracking store: runs go to SQLite, artifacts to a directory
    # (its local artifact store) or to S3.
    mlflow.set_tracking_uri(f"sqlite:///{args.tracking}/mlflow.db")
    location = args.s3 or f"file://{args.tracking}/artifacts"
    experiment = mlflow.create_experiment("bench", artifact_location=location)
    with mlflow.start_run(experiment_id=experiment):
        started = time.perf_counter()
        mlflow.log_artifacts(args.src, artifact_path="checkpoint")
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "mlflow": mlflow.__version__}))


if __name__ == "__main__":
    main()

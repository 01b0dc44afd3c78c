# make run   install what is missing, then start fleetadmin on the embedded default
# make test  install what the tests need, then run the whole suite
.PHONY: run test lint

export OMP_THREAD_LIMIT := 1

run:
	@bin/install run
	.venv/bin/python manage.py up

test:
	@bin/install test
	Q_CLUSTER_NAME=$${Q_CLUSTER_NAME:-fa-test-$$$$} .venv/bin/python -m pytest $(PYTEST_ARGS)

lint:
	@bin/install test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

.PHONY: test

# test runs every check against real Redis (see scripts/test).
test:
	scripts/test

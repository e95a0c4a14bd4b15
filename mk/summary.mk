# One-line figures of the test run (e2e scenario summaries, controller
# latency): tests append them to $(TEST_SUMMARY) through
# internal/testsummary, and `make test` prints the file at its end (go test
# ./... shows the logs of passing packages to nobody).

TEST_SUMMARY := $(CURDIR)/.cache/test-summary.txt

.PHONY: test-summary-reset test-summary
test-summary-reset:
	@mkdir -p $(dir $(TEST_SUMMARY)) && rm -f $(TEST_SUMMARY)

test-summary:
	@echo "=== test summary ($(TEST_SUMMARY))"; \
	if [ -s $(TEST_SUMMARY) ]; then sort $(TEST_SUMMARY); else echo "(no summary lines: were the e2e and controller tests skipped?)"; fi

TEST_DEPS += test-summary-reset
TEST_ENV += NATGW_TEST_SUMMARY="$(TEST_SUMMARY)"
TEST_AFTER += test-summary

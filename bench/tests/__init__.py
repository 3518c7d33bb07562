# SPDX-License-Identifier: Apache-2.0
"""The bench's own tests: its scoring, reports and variant objects (run with the product's tests, pytest testpaths)."""

// Package repocheck holds the repository-wide checks that belong to no one
// package; it has only tests. TestLayoutNamesEveryPackage: the "## Layout"
// table of README.md names every package of the module (`go list ./...`),
// each by its path relative to the module (e.g. `nat/nftables`) in the
// first column of a row, and every path that column names exists.
package repocheck

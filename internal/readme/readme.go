// Package readme holds the tests that keep the README true: each Go block
// is built as printed, a program is run, a test file is run as a test; and
// every sh block is run as written, in order, on a fresh clone (from
// examples/cli where the README says so), each line succeeding or refused
// where its comment says it is. It has no code of its own.
package readme

// Package readme holds the test that keeps the README's Go blocks true:
// each is built as printed, a program is run, a test file is run as a
// test. It has no code of its own.
package readme

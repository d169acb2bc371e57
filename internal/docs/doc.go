// Package docs holds the tests that keep the project's docs/ true: every
// constant of the runner protocol's wire package is named in
// docs/runner-protocol.md, every route of the OpenAPI document in
// docs/api.md, every provider's capabilities and optional interfaces in
// docs/contract.md's tables as the providers themselves report them, and
// every file a doc names exists. It has no code of its own.
package docs

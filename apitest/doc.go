// Package apitest checks the service's JSON API against its OpenAPI 3.1
// document (server.OpenAPIDocument) with pb33f's libopenapi-validator. It is
// a module of its own so that the validator and its dependencies stay out of
// the library's go.mod; it holds only tests.
package apitest

package server

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
)

// OpenAPIDocument is the JSON API's OpenAPI 3.1 description, served at
// /v1/openapi.json. A test checks every endpoint's real requests and
// responses against it, so it cannot drift from the code.
//
//go:embed openapi.json
var OpenAPIDocument []byte

// indexBody is /v1/'s answer, built from the document's paths and
// summaries once, so the index lists what the document describes.
var indexBody = func() []byte {
	var doc struct {
		Paths map[string]map[string]struct {
			Summary string `json:"summary"`
		} `json:"paths"`
	}
	type endpoint struct {
		Method  string `json:"method"`
		Path    string `json:"path"`
		Summary string `json:"summary"`
	}
	idx := struct {
		Service   string     `json:"service"`
		OpenAPI   string     `json:"openapi"`
		Endpoints []endpoint `json:"endpoints"`
	}{Service: "sluice", OpenAPI: "openapi.json", Endpoints: []endpoint{}}
	if err := json.Unmarshal(OpenAPIDocument, &doc); err == nil { // the package tests parse it too
		for path, ops := range doc.Paths {
			for method, op := range ops {
				idx.Endpoints = append(idx.Endpoints, endpoint{strings.ToUpper(method), path, op.Summary})
			}
		}
	}
	slices.SortFunc(idx.Endpoints, func(a, b endpoint) int { return strings.Compare(a.Path+" "+a.Method, b.Path+" "+b.Method) })
	b, _ := json.Marshal(idx)
	return append(b, '\n')
}()

// index serves GET /v1/: the endpoints, and the document as the
// service description (RFC 8631).
func (a *api) index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Link", `<openapi.json>; rel="service-desc"`)
	w.Write(indexBody)
}

func (a *api) openapi(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(OpenAPIDocument)
}

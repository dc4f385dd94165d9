//! Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer of the HTTP API.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// 400: the request is malformed or a parameter is out of range.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send `Authorization: Bearer KEY`)".into(),
            kind: "authentication_error",
            param: None,
        }
    }

    /// 429: every slot is busy and the queue is full.
    pub fn queue_full() -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "the server is busy: every slot is in use and the queue is full; retry later"
                .into(),
            kind: "rate_limit_error",
            param: None,
        }
    }

    /// 503: the model is still loading.
    pub fn loading() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the model is loading".into(),
            kind: "unavailable_error",
            param: None,
        }
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
        }
    }

    /// 404: no such route.
    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no route {path}"),
            kind: "invalid_request_error",
            param: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        r
    }
}

"""The in-process API's classes, under the names Triton's `tritonserver` package keeps them
(`tritonserver._api._response.InferenceResponse`, ...), which programs written for it name."""

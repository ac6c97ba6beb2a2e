// intentionally blank

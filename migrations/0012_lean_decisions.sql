-- Reserved for the lean decision layer (issue 10); this branch adds nothing here.
SELECT 1;

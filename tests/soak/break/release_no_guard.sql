-- BROKEN ON PURPOSE (test builds only): release without the presence guard.
-- Releasing a permit that is already released decrements its quotas again
-- (guarantees 2 and 3): a duplicate or retried release frees a slot that
-- another permit holds. The soak checker must report admitted_once.
-- @function pgcoord.permits_release_locked
-- @replace
		WHERE p.id = ANY (p_ids) AND p.state <> 'released'
-- @with
		WHERE p.id = ANY (p_ids)
-- @end
-- @function pgcoord.permit_release
-- @replace
	IF v_p.state = 'released' THEN
		RETURN ('already_released', v_p.state, pgcoord.ms(v_p.released_at),
			pgcoord.ms(now()))::pgcoord.release_decision;
	END IF;
-- @with
-- @end
-- @function pgcoord.permit_release_group
-- @replace
		WHERE p.id = m.id AND p.released_at IS NULL
		  AND (m.override OR p.state = 'held')
-- @with
		WHERE p.id = m.id
-- @end
-- @function pgcoord.permit_release_one
-- @replace
	WHERE p.id = p_id AND q.key = p.quota_key AND p.released_at IS NULL
	  AND (p_override OR p.state = 'held')
-- @with
	WHERE p.id = p_id AND q.key = p.quota_key
-- @end
-- @replace
			WHERE p.id = p_id AND p.released_at IS NULL AND p.quota_key = v_key
			  AND (p_override OR p.state = 'held')
-- @with
			WHERE p.id = p_id AND p.quota_key = v_key
-- @end
